"""A built wheel installs and loads data where there is no compiler and no Cython.

Users install the wheel, not the checkout: it must carry the compiled extensions
and every module, and work in a fresh environment that has only the runtime
dependencies. The wheel is built from a copy of the checkout (so the checkout's
own build artefacts play no part), with ``python -m build``, as README says.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest
from support import REPO

pytestmark = pytest.mark.slow

# What a fresh clone holds: never the checkout's environments or build outputs.
NOT_SOURCE = shutil.ignore_patterns(
    ".git", ".venv*", "build", "dist", "*.egg-info", "__pycache__", "*.so", "_*.c", "log",
    ".pytest_cache", ".hypothesis", "data", "demo_output",
)
RUNTIME_WITHOUT_TORCH = ["numpy>=1.24", "pyarrow>=14", "multiprocess>=0.70", "tqdm>=4.60"]


def run(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, **kwargs)
    if result.returncode:
        pytest.fail(
            f"{' '.join(command)} exited {result.returncode}:\n"
            f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        )
    return result


def test_built_wheel_installs_and_loads_without_a_compiler(tmp_path: Path) -> None:
    pytest.importorskip("build", reason="python -m build needs the 'build' package")
    source = tmp_path / "source"
    shutil.copytree(REPO, source, ignore=NOT_SOURCE)
    shutil.copytree(REPO / "examples" / "data", source / "examples" / "data")
    dist = tmp_path / "dist"
    # The wheel is built from the sdist (build's default): both must be complete.
    run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(source)])
    wheels = sorted(dist.glob("fleetfeed-*.whl"))
    sdists = sorted(dist.glob("fleetfeed-*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, sorted(p.name for p in dist.iterdir())

    env_dir = tmp_path / "env"
    venv.create(env_dir, with_pip=True)
    python = str(env_dir / "bin" / "python")
    # No compiler and no Cython anywhere the install or the load could look:
    # PATH holds the fresh environment's bin alone, and CC points nowhere.
    bare = {
        "PATH": str(env_dir / "bin"), "CC": "/nonexistent/cc", "HOME": str(tmp_path),
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }
    for name in ("PIP_CONFIG_FILE", "PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_INDEX_URL"):
        if name in os.environ:
            bare[name] = os.environ[name]
    run([python, "-m", "pip", "install", "--quiet", *RUNTIME_WITHOUT_TORCH], env=bare)
    run([python, "-m", "pip", "install", "--quiet", "--no-deps", str(wheels[0])], env=bare)
    assert shutil.which("gcc", path=bare["PATH"]) is None
    assert shutil.which("cc", path=bare["PATH"]) is None

    data = tmp_path / "part-0.txt"
    data.write_text("".join(f"2 {i} {i + 1} 1 {i * 0.5}\n" for i in range(1000)))
    program = f"""
import importlib.util, sys
assert importlib.util.find_spec("Cython") is None, "Cython is installed"
import datafeed, generators
assert "torch" not in sys.modules
from datafeed import InMemoryDataset, Slot
ds = InMemoryDataset()
ds.init(batch_size=10, thread_num=2, pipe_command="cat",
        use_var=[Slot("ids", "uint64"), Slot("x", "float32", (1,))])
ds.set_filelist([{str(data)!r}])
ds.load_into_memory()
table = ds.to_arrow()
print(table.num_rows, table.column("ids")[999].as_py(), table.column("x")[3].as_py())
print(datafeed.__file__)
"""
    out = run([python, "-c", program], env=bare, cwd=tmp_path).stdout.splitlines()
    assert out[0] == "1000 [999, 1000] [1.5]"
    assert out[1].startswith(str(env_dir))  # the installed wheel's, not the checkout's
