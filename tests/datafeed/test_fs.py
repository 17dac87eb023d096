"""Input files: names never reach a shell; remote files through pyarrow.fs (issue 6).

The pipe command is a shell command by design; the input file is opened by
fleetfeed and fed to the command's standard input, so a file named like a
shell injection is just a file. Local files that fleetfeed writes (caches,
checkpoints, the restart record) are written whole or not at all
(``write_atomically``).
"""

from __future__ import annotations

import errno
import gzip
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import quote

import pyarrow.fs as pafs
import pytest
from support import SMALL_SCHEMA, small_line, small_record, write_small_files

import datafeed
from datafeed import DatafeedError, InMemoryDataset, QueueDataset, ReaderError, SchemaError, Slot
from datafeed.source import fs, ranges

HOSTILE_NAMES = [
    'a"; rm -rf x; ".txt',
    "$(touch pwned).txt",
    "`touch pwned2`; rm -rf x .txt",
    "b'; rm -rf x; echo '.txt",
]

# A reader that copies its stdin through Python (a real pipe command, not `cat`).
PY_READER = f"{sys.executable} -c \"import sys; sys.stdout.write(sys.stdin.read())\""


@pytest.fixture
def hostile_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory with a canary folder ``x`` that ``rm -rf x`` would delete."""
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "keep").write_text("canary")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _write(directory: Path, name: str, first: int, count: int, gz: bool = False) -> str:
    text = "".join(small_line(first + i) for i in range(count))
    path = directory / (name + ".gz" if gz else name)
    if gz:
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return str(path)


def _assert_untouched(directory: Path) -> None:
    assert (directory / "x" / "keep").read_text() == "canary"
    assert not list(directory.glob("pwned*"))
    assert not list(Path.cwd().glob("pwned*"))


@pytest.mark.parametrize("pipe_command", ["cat", PY_READER, "cat | cat"])
@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gz"])
def test_hostile_file_names_are_just_files(hostile_dir: Path, pipe_command: str, gz: bool):
    paths = [
        _write(hostile_dir, name, first=10 * i, count=3, gz=gz)
        for i, name in enumerate(HOSTILE_NAMES)
    ]
    dataset = InMemoryDataset()
    dataset.init(batch_size=4, thread_num=2, use_var=SMALL_SCHEMA, pipe_command=pipe_command)
    dataset.set_filelist(paths)
    dataset.load_into_memory()
    got = dataset.to_arrow().to_pylist()
    want = [small_record(10 * i + k) for i in range(len(HOSTILE_NAMES)) for k in range(3)]
    assert len(got) == len(want)
    for row, record in zip(got, want, strict=True):
        assert row["ids"] == record["ids"] and row["signed"] == record["signed"]
        assert row["label"] == record["label"]
        assert row["dense"] == pytest.approx(record["dense"])
    assert [s.path for s in dataset.stats().per_file] == paths
    _assert_untouched(hostile_dir)


def test_hostile_file_names_in_a_queue_dataset_and_byte_ranges(
    hostile_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    # One file and 4 threads: the file is read as byte ranges, which go through
    # `head -c N | <command>` with the file on stdin, never by name.
    monkeypatch.setattr(ranges, "MIN_RANGE_BYTES", 4096)
    path = _write(hostile_dir, HOSTILE_NAMES[0], first=0, count=4000)
    assert len(ranges.plan_tasks([path], 4, ranges.MIN_RANGE_BYTES)) == 4
    for cls in (InMemoryDataset, QueueDataset):
        dataset = cls()
        dataset.init(batch_size=1000, thread_num=4, use_var=SMALL_SCHEMA, pipe_command=PY_READER)
        dataset.set_filelist([path])
        if cls is InMemoryDataset:
            dataset.load_into_memory()
        assert sum(batch.size for batch in dataset) == 4000
    _assert_untouched(hostile_dir)


def test_a_hostile_name_in_an_error_message_is_quoted_text(hostile_dir: Path):
    path = _write(hostile_dir, HOSTILE_NAMES[1], first=0, count=2)
    dataset = InMemoryDataset()
    dataset.init(use_var=SMALL_SCHEMA, pipe_command="cat >/dev/null; exit 4")
    dataset.set_filelist([path])
    with pytest.raises(RuntimeError, match=r"exited with status 4 on .*\$\(touch pwned\)\.txt"):
        dataset.load_into_memory()
    _assert_untouched(hostile_dir)
    assert os.path.isfile(path)


# -- remote files through pyarrow.fs (issue 6, item 1) ---------------------------------

BUCKET = "fleetfeed-test"
SPARSE_SCHEMA = [Slot("ids", "uint64"), Slot("label", "int64", (1,))]


@pytest.fixture(scope="module")
def s3_server():
    """A real S3-protocol server (moto's server mode) on 127.0.0.1, for this module."""
    moto_server = pytest.importorskip("moto.server")
    boto3 = pytest.importorskip("boto3")
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        port = server._server.server_port
        endpoint = f"http://127.0.0.1:{port}"
        client = boto3.client(
            "s3", endpoint_url=endpoint, region_name="us-east-1",
            aws_access_key_id="testing", aws_secret_access_key="testing",
        )
        client.create_bucket(Bucket=BUCKET)
        yield client, f"?endpoint_override=127.0.0.1:{port}&scheme=http&region=us-east-1"
    finally:
        server.stop()


@pytest.fixture
def s3(s3_server, monkeypatch: pytest.MonkeyPatch):
    """The S3 client and the URI query of the server; credentials in the environment."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    return s3_server


def _upload(client, key: str, data: bytes) -> None:
    client.put_object(Bucket=BUCKET, Key=key, Body=data)


def _load(cls, paths, pipe_command="cat", thread_num=2, **settings):
    dataset = cls()
    dataset.init(batch_size=4, thread_num=thread_num, use_var=SMALL_SCHEMA,
                 pipe_command=pipe_command, **settings)
    dataset.set_filelist(paths)
    if cls is InMemoryDataset:
        dataset.load_into_memory()
        return dataset.to_arrow().to_pylist(), dataset.stats()
    rows = []
    for batch in dataset:
        rows.append(batch.size)
    return sum(rows), dataset.stats()


@pytest.mark.parametrize("pipe_command", ["cat", PY_READER])
def test_s3_files_load_exactly_like_local_files(s3, tmp_path: Path, pipe_command: str):
    client, query = s3
    (tmp_path / "gz").mkdir()
    local = write_small_files(tmp_path, files=2, per_file=7)
    local += write_small_files(tmp_path / "gz", files=1, per_file=5, gz=True)
    remote = []
    for i, path in enumerate(local):
        key = f"day1/{i}-{os.path.basename(path)}"
        _upload(client, key, Path(path).read_bytes())
        remote.append(f"s3://{BUCKET}/{key}{query}")
    want, local_stats = _load(InMemoryDataset, local, pipe_command)
    got, remote_stats = _load(InMemoryDataset, remote, pipe_command)
    assert got == want and len(got) == 19
    assert [f.path for f in remote_stats.per_file] == remote
    assert [(f.lines, f.records, f.bytes) for f in remote_stats.per_file] == [
        (f.lines, f.records, f.bytes) for f in local_stats.per_file
    ]
    count, _ = _load(QueueDataset, remote, pipe_command)
    assert count == 19


def test_a_command_that_stops_reading_a_remote_file_early(s3):
    client, query = s3
    text = "".join(small_line(i) for i in range(20000)).encode()  # ~0.8 MB: several feeds
    _upload(client, "early/big.txt", text)
    uri = f"s3://{BUCKET}/early/big.txt{query}"
    rows, stats = _load(InMemoryDataset, [uri], pipe_command="head -n 3", thread_num=1)
    assert len(rows) == 3 and stats.lines == 3
    assert rows[2]["ids"] == small_record(2)["ids"]


def test_a_missing_object_is_file_not_found(s3, tmp_path: Path):
    client, query = s3
    _upload(client, "gone/a.txt", small_line(1).encode())
    present = f"s3://{BUCKET}/gone/a.txt{query}"
    absent = f"s3://{BUCKET}/gone/nope.txt{query}"
    dataset = InMemoryDataset()
    dataset.init(use_var=SMALL_SCHEMA)
    with pytest.raises(FileNotFoundError, match=r"1 of 2 input files do not exist: s3://.*/gone/nope\.txt"):
        dataset.set_filelist([present, absent])
    dataset.set_filelist([present])
    client.delete_object(Bucket=BUCKET, Key="gone/a.txt")
    with pytest.raises(FileNotFoundError, match=r"no longer exist: s3://.*/gone/a\.txt"):
        dataset.load_into_memory()
    with pytest.raises(FileNotFoundError, match="no file at"):
        fs.open_input(absent)


def test_list_files_expands_a_days_folder(s3, tmp_path: Path):
    client, query = s3
    for key in ("2024-05-01/part-0.gz", "2024-05-01/part-1.gz", "2024-05-01/_SUCCESS",
                "2024-05-01/sub/part-9.gz", "2024-05-02/part-0.gz"):
        _upload(client, key, gzip.compress(small_line(0).encode()))
    found = datafeed.list_files(f"s3://{BUCKET}/2024-05-01/{query}", "part-*")
    assert found == [f"s3://{BUCKET}/2024-05-01/part-{i}.gz{query}" for i in (0, 1)]
    deep = datafeed.list_files(f"s3://{BUCKET}/2024-05-01{query}", "*part-*", recursive=True)
    assert [p.split("?")[0].rsplit("/", 2)[-2:] for p in deep] == [
        ["2024-05-01", "part-0.gz"], ["2024-05-01", "part-1.gz"], ["sub", "part-9.gz"]
    ]
    rows, stats = _load(InMemoryDataset, found)
    assert len(rows) == 2 and stats.files == 2
    with pytest.raises(FileNotFoundError, match="no directory at"):
        datafeed.list_files(f"s3://{BUCKET}/2099-01-01/{query}")


def test_the_cli_reads_s3_uris(s3, tmp_path: Path):
    client, query = s3
    _upload(client, "cli/a.txt", b"1 5 1 0\n1 x 1 1\n1 7 1 0\n")
    uri = f"s3://{BUCKET}/cli/a.txt{query}"
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    result = subprocess.run(
        [sys.executable, "-m", "datafeed.cli", "check", uri, "--slots", "ids:uint64,label:int64:1"],
        check=False, capture_output=True, text=True, timeout=120, env=env,
    )
    assert result.returncode == 1, result.stderr
    assert f"{uri}:2: slot 'ids': expected an unsigned integer, found b'x'" in result.stdout


def test_local_file_uris_and_directories(tmp_path: Path):
    paths = write_small_files(tmp_path, files=2, per_file=3)
    uris = [f"file://{p}" for p in paths]
    assert datafeed.list_files(f"file://{tmp_path}", "part-*.txt") == uris
    assert datafeed.list_files(str(tmp_path), "part-*.txt") == paths
    got, _ = _load(InMemoryDataset, uris)
    want, _ = _load(InMemoryDataset, paths)
    assert got == want


def test_the_filesystem_setting_takes_pyarrow_and_fsspec_filesystems(tmp_path: Path):
    paths = write_small_files(tmp_path, files=2, per_file=4)
    want, _ = _load(InMemoryDataset, paths)
    subtree = pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem())
    got, _ = _load(InMemoryDataset, ["part-0.txt", "part-1.txt"], filesystem=subtree)
    assert got == want
    fsspec = pytest.importorskip("fsspec")
    memory = fsspec.filesystem("memory")
    for path in paths:
        memory.pipe(f"/fleetfeed/{os.path.basename(path)}", Path(path).read_bytes())
    try:
        got, _ = _load(InMemoryDataset, ["/fleetfeed/part-0.txt", "/fleetfeed/part-1.txt"],
                       pipe_command=PY_READER, filesystem=memory)
        assert got == want
        dataset = InMemoryDataset()
        dataset.init(use_var=SMALL_SCHEMA, filesystem=memory)
        with pytest.raises(FileNotFoundError, match="/fleetfeed/nope.txt"):
            dataset.set_filelist(["/fleetfeed/nope.txt"])
    finally:
        memory.rm("/fleetfeed", recursive=True)
    with pytest.raises(SchemaError, match="'filesystem' setting must be"):
        InMemoryDataset().init(use_var=SMALL_SCHEMA, filesystem="s3")


def test_a_remote_read_that_fails_midway_fails_the_load_through_a_pipe_command(tmp_path: Path):
    # pyarrow's ArrowInvalid is a ValueError: a read raising it must not pass
    # for the end of the file (the command would see EOF and exit 0).
    import io

    import pyarrow as pa

    memory = pytest.importorskip("fsspec.implementations.memory")
    paths = write_small_files(tmp_path, files=1, per_file=400)
    data = Path(paths[0]).read_bytes()
    cut = data.index(b"\n", len(data) // 2) + 1  # at a line end: a silent cut looks whole

    class FailingStream(io.RawIOBase):
        def __init__(self) -> None:
            self.at = 0

        def readable(self) -> bool:
            return True

        def read(self, size: int = -1) -> bytes:
            if self.at >= cut:
                raise pa.ArrowInvalid("connection reset while decoding response")
            size = 4096 if size is None or size < 0 else min(size, 4096)
            chunk = data[self.at : min(self.at + size, cut)]
            self.at += len(chunk)
            return chunk

    class Flaky(memory.MemoryFileSystem):
        protocol = "flaky"

        def _open(self, path, mode="rb", **kwargs):
            return FailingStream() if mode == "rb" else super()._open(path, mode, **kwargs)

    flaky = Flaky()
    flaky.pipe("/fleetfeed/part-0.txt", data)
    try:
        for command in ("cat", PY_READER):
            with pytest.raises((ReaderError, pa.ArrowInvalid),
                               match="connection reset while decoding response"):
                _load(InMemoryDataset, ["/fleetfeed/part-0.txt"], pipe_command=command,
                      filesystem=flaky)
    finally:
        flaky.rm("/fleetfeed", recursive=True)


def test_paddle_fs_name_maps_onto_hdfs():
    assert fs.hdfs_args("hdfs://namenode:9000", "alice,secret") == {
        "host": "namenode", "port": 9000, "user": "alice"
    }
    assert fs.hdfs_args("afs://nn.example.com", "") == {"host": "nn.example.com", "port": 8020}
    with pytest.raises(SchemaError, match="'fs_name' setting must look like"):
        fs.hdfs_args("s3://bucket")


def test_hdfs_without_libhdfs_is_a_clear_error():
    try:
        pafs.HadoopFileSystem("127.0.0.1", 1)
    except OSError:
        pass
    else:  # pragma: no cover - a machine with Hadoop installed
        pytest.skip("libhdfs is installed here")
    dataset = InMemoryDataset()
    dataset.init(use_var=SMALL_SCHEMA, fs_name="hdfs://127.0.0.1:1", fs_ugi="alice,pw")
    with pytest.raises(DatafeedError, match=r"cannot connect to HDFS 'hdfs://127.0.0.1:1'.*libhdfs"):
        dataset.set_filelist(["/data/part-0"])


def test_the_python_snippets_of_docs_remote_files_md_run():
    text = (Path(__file__).resolve().parents[2] / "docs" / "remote_files.md").read_text()
    # Blocks marked <!-- not-tested: ... --> (tests/repository/test_docs.py) need a Hadoop client.
    snippets = re.findall(r"(?<!-->\n)^```python\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)
    assert snippets
    for snippet in snippets:
        exec(compile(snippet, "docs/remote_files.md", "exec"), {})  # noqa: S102 - our own docs


def test_a_cache_of_s3_files_is_reused_and_goes_stale_when_an_object_changes(
    s3, tmp_path: Path
):
    from datafeed import CacheError

    client, query = s3
    _upload(client, "cached/a.txt", "".join(small_line(i) for i in range(6)).encode())
    uri = f"s3://{BUCKET}/cached/a.txt{query}"
    cache_file = tmp_path / "records.arrow"
    first, _ = _load(InMemoryDataset, [uri], cache=str(cache_file))
    assert cache_file.exists() and len(first) == 6
    again, stats = _load(InMemoryDataset, [uri], cache=str(cache_file))
    assert again == first and stats.per_file[0].path == uri  # read from the cache
    time.sleep(1.1)  # S3 mtimes have a one-second resolution
    _upload(client, "cached/a.txt", "".join(small_line(i) for i in range(7)).encode())
    stale = r"stale cache .*: source s3://.*cached/a\.txt\?endpoint.* changed .*size 200 -> 229"
    with pytest.raises(CacheError, match=stale):
        _load(InMemoryDataset, [uri], cache=str(cache_file))


def test_a_cache_of_files_read_through_download_cmd_is_refused_before_loading(tmp_path: Path):
    from datafeed import CacheError

    files = write_small_files(tmp_path, files=1, per_file=3)
    with pytest.raises(CacheError, match="files read through download_cmd have none"):
        _load(InMemoryDataset, files, download_cmd="cat --", cache=str(tmp_path / "c.arrow"))


# -- write_atomically: a local file written whole or not at all ------------------------


def _names(directory: Path) -> list[str]:
    return sorted(path.name for path in directory.iterdir())


@pytest.mark.parametrize(
    "content",
    [b"new", lambda temporary: Path(temporary).write_bytes(b"new")],
    ids=["bytes", "writer"],
)
def test_write_atomically_replaces_the_file_and_leaves_nothing_else(tmp_path: Path, content):
    path = tmp_path / "state.json"
    path.write_bytes(b"old")
    fs.write_atomically(str(path), content)
    assert path.read_bytes() == b"new"
    assert _names(tmp_path) == ["state.json"]


def test_write_atomically_gives_the_mode_open_gives(tmp_path: Path):
    plain = tmp_path / "plain"
    plain.write_bytes(b"")
    atomic = tmp_path / "atomic"
    fs.write_atomically(str(atomic), b"x")
    assert atomic.stat().st_mode & 0o777 == plain.stat().st_mode & 0o777


def test_a_write_that_fails_midway_leaves_the_older_file_and_no_temporary_file(tmp_path: Path):
    path = tmp_path / "model.pt"
    path.write_bytes(b"the older file")

    def fails_midway(temporary: str) -> None:
        with open(temporary, "wb") as out:
            out.write(b"half of the new file")
        raise RuntimeError("the serializer failed")

    with pytest.raises(RuntimeError, match="the serializer failed"):
        fs.write_atomically(str(path), fails_midway)
    assert path.read_bytes() == b"the older file"
    assert _names(tmp_path) == ["model.pt"]


@pytest.mark.parametrize("as_uri", [False, True])
def test_a_stream_write_is_whole_or_leaves_the_older_file(tmp_path: Path, as_uri: bool):
    path = tmp_path / "donefile.txt"
    name = path.as_uri() if as_uri else str(path)  # file:// goes through pyarrow's move
    path.write_bytes(b"the older file")

    def fails_midway(out) -> None:
        out.write(b"half of")
        raise RuntimeError("the writer failed")

    with pytest.raises(RuntimeError, match="the writer failed"):
        fs.write_stream_atomically(name, fails_midway)
    assert path.read_bytes() == b"the older file"
    assert _names(tmp_path) == ["donefile.txt"]
    fs.write_stream_atomically(name, lambda out: out.write(b"the new file"))
    assert path.read_bytes() == b"the new file"
    assert _names(tmp_path) == ["donefile.txt"]


class _Crash(BaseException):
    """The process died here (a BaseException: nothing catches it as an error)."""


class _HdfsLikeMoves(pafs.FSSpecHandler):
    """A local folder with HDFS's move over a file (pyarrow's HadoopFileSystem:
    delete the target, then rename); ``crash`` stops a move over a file
    ``"before"`` it deletes or ``"between"`` the delete and the rename."""

    def __init__(self) -> None:
        import fsspec

        super().__init__(fsspec.filesystem("file"))
        self.crash: str | None = None

    def move(self, src: str, dest: str) -> None:
        if self.fs.isfile(dest):
            if self.crash == "before":
                raise _Crash
            self.fs.rm(dest)
            if self.crash == "between":
                raise _Crash
        self.fs.mv(src, dest)


@pytest.fixture
def hdfs_like(monkeypatch: pytest.MonkeyPatch) -> _HdfsLikeMoves:
    """hdfs:// paths resolved to this machine's files, moved as HDFS moves them."""
    handler = _HdfsLikeMoves()
    filesystem = pafs.PyFileSystem(handler)
    real = fs.resolve

    def resolve(path: str, filesystem_arg=None):
        if path.startswith("hdfs://"):
            return filesystem, path[len("hdfs://nn:9000"):]
        return real(path, filesystem_arg)

    monkeypatch.setattr(fs, "resolve", resolve)
    return handler


def test_a_replacement_cut_by_a_crash_on_hdfs_keeps_every_line(
    tmp_path: Path, hdfs_like: _HdfsLikeMoves
):
    path = tmp_path / "donefile.txt"
    uri = f"hdfs://nn:9000{path}"
    fs.write_stream_atomically(uri, lambda out: out.write(b"pass 1\n"))
    assert path.read_bytes() == b"pass 1\n" and _names(tmp_path) == ["donefile.txt"]
    # Died between HDFS's delete and its rename: the new content waits complete.
    hdfs_like.crash = "between"
    with pytest.raises(_Crash):
        fs.write_stream_atomically(uri, lambda out: out.write(b"pass 1\npass 2\n"))
    assert _names(tmp_path) == [".donefile.txt.next"]
    assert fs.read_replaced(uri) == b"pass 1\npass 2\n"
    hdfs_like.crash = None
    fs.finish_replacement(uri)  # for readers that look for the file itself
    assert path.read_bytes() == b"pass 1\npass 2\n" and _names(tmp_path) == ["donefile.txt"]
    # The next write puts one in place first, then replaces it.
    hdfs_like.crash = "between"
    with pytest.raises(_Crash):
        fs.write_stream_atomically(uri, lambda out: out.write(b"pass 1\npass 2\n"))
    hdfs_like.crash = None
    fs.write_stream_atomically(uri, lambda out: out.write(fs.read_replaced(uri) + b"pass 3\n"))
    assert path.read_bytes() == b"pass 1\npass 2\npass 3\n"
    assert _names(tmp_path) == ["donefile.txt"]
    # Died before the delete: the old content reads; the stale successor goes.
    hdfs_like.crash = "before"
    with pytest.raises(_Crash):
        fs.write_stream_atomically(uri, lambda out: out.write(b"never listed\n"))
    assert fs.read_replaced(uri) == b"pass 1\npass 2\npass 3\n"
    hdfs_like.crash = None
    fs.write_stream_atomically(uri, lambda out: out.write(b"pass 4\n"))
    assert path.read_bytes() == b"pass 4\n" and _names(tmp_path) == ["donefile.txt"]
    # A writer that fails leaves the file as it was, and no temporary file.
    def fails_midway(out) -> None:
        out.write(b"half of")
        raise RuntimeError("the writer failed")

    with pytest.raises(RuntimeError, match="the writer failed"):
        fs.write_stream_atomically(uri, fails_midway)
    assert path.read_bytes() == b"pass 4\n" and _names(tmp_path) == ["donefile.txt"]
    assert fs.read_replaced(f"hdfs://nn:9000{tmp_path}/absent.txt") is None


def test_the_online_commit_log_survives_a_crash_inside_an_hdfs_replacement(
    tmp_path: Path, hdfs_like: _HdfsLikeMoves
):
    from trainer.loop import online

    output = f"hdfs://nn:9000{tmp_path}"
    assert online.write_model_donefile(output, "20240501", 1, 7)
    hdfs_like.crash = "between"
    with pytest.raises(_Crash):
        online.write_model_donefile(output, "20240501", 2, 7)
    # Without the successor a restart would find no log and train from scratch.
    assert online.last_saved_model(output) == (20240501, 2, f"{output}/20240501/2/", 7)
    hdfs_like.crash = None
    # Its writer, writing nothing (listed already), still puts it in place.
    assert not online.write_model_donefile(output, "20240501", 2, 7)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["donefile.txt"]
    assert online.write_model_donefile(output, "20240501", 3, 7)
    lines = (tmp_path / "donefile.txt").read_text().splitlines()
    assert [line.split("\t")[3] for line in lines] == ["1", "2", "3"]


def test_a_sync_that_fails_leaves_the_older_file_and_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    path = tmp_path / "last_checkpoint.json"
    path.write_bytes(b"the older file")

    def no_space(descriptor: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", no_space)  # the data reached no disk
    with pytest.raises(OSError, match="No space left on device"):
        fs.write_atomically(str(path), b"the new file")
    assert path.read_bytes() == b"the older file"
    assert _names(tmp_path) == ["last_checkpoint.json"]


def test_file_uris_are_percent_decoded(tmp_path: Path):
    """``file:///a%20b/c`` names ``/a b/c``, as RFC 8089 says; ``list_files`` quotes
    the names it returns, so a ``%`` or ``#`` in a name survives the round trip."""
    directory = tmp_path / "day one"
    directory.mkdir()
    paths = [_write(directory, name, first=3 * i, count=3)
             for i, name in enumerate(["part 0%20.txt", "part#1?.txt"])]
    uris = datafeed.list_files("file://" + quote(str(directory)), "part*")
    assert uris == sorted("file://" + quote(p) for p in paths)
    assert fs.exists(uris[0]) and fs.exists("file://localhost" + quote(paths[0]))
    got, _ = _load(InMemoryDataset, uris)
    want, _ = _load(InMemoryDataset, sorted(paths))
    assert got == want


@pytest.mark.parametrize(
    "suffix,says",
    [
        ("?version=2", "a query ('version=2'), which names nothing in a local file"),
        ("#part", "a fragment ('part'), which names nothing in a local file"),
    ],
)
def test_file_uris_with_a_query_or_a_fragment_are_refused(tmp_path: Path, suffix, says):
    uri = "file://" + quote(_write(tmp_path, "part-0.txt", first=0, count=2)) + suffix
    dataset = InMemoryDataset()
    dataset.init(use_var=SMALL_SCHEMA)
    with pytest.raises(SchemaError) as refused:
        dataset.set_filelist([uri])
    assert str(refused.value) == f"the file URI {uri!r} has {says}; expected file:///path"


@pytest.mark.parametrize("host", ["otherhost", "user@localhost", "localhost:8000"])
def test_file_uris_on_another_host_are_refused(tmp_path: Path, host: str):
    uri = f"file://{host}" + quote(_write(tmp_path, "part-0.txt", first=0, count=2))
    with pytest.raises(SchemaError) as refused:
        fs.exists(uri)
    assert str(refused.value) == (
        f"the file URI {uri!r} names the host {host!r}; a file URI names a file of this "
        "machine: expected file:///path or file://localhost/path"
    )


def test_a_file_uri_whose_name_is_not_utf8_is_a_clear_error(tmp_path: Path):
    """pyarrow's filesystems take UTF-8 names only: the URI is refused with the
    reason and the way out (rather than a UnicodeEncodeError)."""
    uri = "file://" + quote(str(tmp_path)) + "/part-%FF.txt"
    with pytest.raises(SchemaError) as refused:
        fs.exists(uri)
    assert str(refused.value) == (
        f"the file URI {uri!r} names a file whose name is not UTF-8 (byte 0xff), which "
        "pyarrow's filesystems cannot open; give its plain path instead"
    )


def test_a_local_file_whose_name_is_not_utf8_is_read_and_measured(tmp_path: Path):
    path = os.fsdecode(os.path.join(os.fsencode(tmp_path), b"part-\xff.txt"))
    Path(path).write_text(small_line(0) + small_line(1))
    assert fs.exists(path) and fs.stat(path).size == os.path.getsize(path)
    assert fs.stat(path).path.endswith("part-\\udcff.txt")  # pyarrow's copy, escaped
    got, stats = _load(InMemoryDataset, [path])
    assert stats.records == 2
    with pytest.raises(FileNotFoundError, match="no file at"):
        fs.stat(path + "-gone")
