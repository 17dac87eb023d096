"""The ``datafeed`` command line (datafeed/cli/commands.py) and the slot spec
(datafeed/config/spec.py).

The commands run for real, as a user runs them (``python -m datafeed.cli``), on
the real samples with the example readers and on files with bad lines.
"""

from __future__ import annotations

import gzip
import json
import math
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from support import REAL_DATA, REPO

from datafeed import InMemoryDataset, SchemaError, Slot, format_slots, parse_slots

CRITEO_RAW = REAL_DATA / "criteo_raw.tsv"
BST = REAL_DATA / "bst_sequences.txt"
CRITEO_READER = f"{sys.executable} {REPO / 'examples/criteo/reader.py'}"
BST_READER = f"{sys.executable} {REPO / 'examples/bst/reader.py'}"
CRITEO_SPEC = "dense_feature:float32:13,C1..C26:uint64,label:int64:1"
BST_SPEC = (
    "userid:int64,history:int64,cate:int64,position:int64,target:int64,"
    "target_cate:int64,target_position:int64,label:int64:1"
)


def datafeed(*args: object, check_status: int | None = 0) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [sys.executable, "-m", "datafeed.cli", *map(str, args)],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    if check_status is not None:
        assert result.returncode == check_status, result.stdout + result.stderr
    return result


@pytest.fixture
def bad_file(tmp_path: Path) -> Path:
    """30 lines of `ids:uint64,label:int64:1`; 12 bad ones (more than the 10 full
    messages the parser keeps in skip mode)."""
    lines = []
    for i in range(30):
        if i == 2:
            lines.append("1 5 1 x\n")  # line 3: not an integer in 'label'
        elif i == 5:
            lines.append("\n")  # line 6: blank
        elif i >= 10 and i % 2 == 0:
            lines.append(f"1 {i} 2 1 0\n")  # lines 11, 13, ..., 29: dense count 2
        else:
            lines.append(f"1 {i} 1 {i % 2}\n")
    path = tmp_path / "bad.txt"
    path.write_text("".join(lines))
    return path


BAD_LINES = [3, 6] + list(range(11, 30, 2))


# -- the slot spec -----------------------------------------------------------------------


def test_parse_slots_compact_with_ranges_and_shapes():
    slots = parse_slots(CRITEO_SPEC)
    assert len(slots) == 28
    assert slots[0] == Slot("dense_feature", "float32", (13,))
    assert [s.name for s in slots[1:27]] == [f"C{i}" for i in range(1, 27)]
    assert all(s.dtype == "uint64" and s.shape is None for s in slots[1:27])
    assert slots[27] == Slot("label", "int64", (1,))
    assert parse_slots("A1..3:int64, m:float32:2x3") == [
        Slot("A1", "int64"), Slot("A2", "int64"), Slot("A3", "int64"),
        Slot("m", "float32", (2, 3)),
    ]
    assert parse_slots(format_slots(slots)) == slots


def test_parse_slots_reads_a_slots_file(tmp_path: Path):
    path = tmp_path / "slots.txt"
    path.write_text("# criteo\ndense_feature float32 13\nC1..C26 uint64\n\nlabel:int64:1  # last\n")
    assert parse_slots(path) == parse_slots(CRITEO_SPEC)
    (tmp_path / "bad.txt").write_text("a int64\nb int8\n")
    with pytest.raises(SchemaError, match=r"bad\.txt, line 2.*'int8'"):
        parse_slots(tmp_path / "bad.txt")


@pytest.mark.parametrize(
    "spec, message",
    [
        ("a", r"entry 1 \('a'\): expected name:dtype\[:shape\]"),
        ("a:int64,b:int8", r"entry 2 .*dtype must be one of"),
        ("a:int64:0", r"a shape must be positive"),
        ("a:float32:3y", r"shape must be positive ints joined by 'x'"),
        ("C3..C1:int64", r"ends before it starts"),
        ("a:int64,a:uint64", r"'a' appears twice"),
        ("", r"declares no slots"),
    ],
)
def test_parse_slots_errors_say_where(spec: str, message: str):
    with pytest.raises(SchemaError, match=message):
        parse_slots(spec)


def test_a_name_range_is_bounded_before_it_is_expanded(tmp_path: Path):
    """``C1..C100000000`` would be 10**8 Slot objects (3.6 GB): refused at once."""
    from datafeed.config.spec import MAX_SLOTS

    with pytest.raises(SchemaError) as refused:
        parse_slots(f"label:int64:1,C1..C{MAX_SLOTS}:uint64")
    assert str(refused.value) == (
        f"slot spec entry 2 ('C1..C{MAX_SLOTS}:uint64'): the range 'C1..C{MAX_SLOTS}' "
        f"stands for {MAX_SLOTS} slots, which makes {MAX_SLOTS + 1} in all; a spec "
        f"declares at most {MAX_SLOTS} slots"
    )
    assert len(parse_slots(f"C1..C{MAX_SLOTS}:uint64")) == MAX_SLOTS
    slots_file = tmp_path / "slots.txt"
    slots_file.write_text("label int64 1\nC1..C100000000 uint64\n")
    with pytest.raises(SchemaError, match=rf"{re.escape(str(slots_file))}, line 2: the "
                       r"range 'C1..C100000000' stands for 100000000 slots"):
        parse_slots(slots_file)
    result = datafeed("check", BST, "--slots", "C1..C100000000:uint64", check_status=2)
    assert "stands for 100000000 slots" in result.stderr


# -- help and usage ----------------------------------------------------------------------


@pytest.mark.parametrize("command", ["preview", "check", "stats", "convert"])
def test_every_command_has_help(command: str):
    result = datafeed(command, "--help")
    assert "--slots SPEC" in result.stdout and "--pipe CMD" in result.stdout
    assert "--progress" in result.stdout


def test_top_level_help_lists_the_commands():
    out = datafeed("--help").stdout
    for command in ("preview", "check", "stats", "convert"):
        assert command in out


def test_console_script_is_declared():
    text = (REPO / "pyproject.toml").read_text()
    assert 'datafeed = "datafeed.cli.commands:main"' in text


def test_usage_errors_exit_2(tmp_path: Path):
    result = datafeed("check", tmp_path / "nope.txt", "--slots", "a:int64", check_status=2)
    assert "nope.txt" in result.stderr and "do not exist" in result.stderr
    result = datafeed("check", BST, "--slots", "a:int8", check_status=2)
    assert "dtype must be one of" in result.stderr


# -- preview -----------------------------------------------------------------------------


def test_preview_criteo_decodes_each_slot_by_name():
    result = datafeed(
        "preview", CRITEO_RAW, "--pipe", CRITEO_READER, "--slots", CRITEO_SPEC, "-n", 2
    )
    out = result.stdout
    assert out.count("record ") == 2
    first = CRITEO_RAW.read_text().splitlines()[0].split("\t")
    c1 = (1 << 32) | int(first[14], 16)
    assert f"  C1             uint64  sparse     count   1: {c1}\n" in out
    dense = [math.log1p(max(int(v), 0)) if v else 0.0 for v in first[1:14]]
    shown = " ".join(f"{v:.6g}" for v in dense[:8])
    assert f"dense_feature  float32 dense[13]  count  13: {shown} ... (+5 more)" in out
    assert f"  label          int64   dense[1]   count   1: {first[0]}\n" in out


def test_preview_bst_shows_variable_lengths():
    out = datafeed("preview", BST, "--pipe", BST_READER, "--slots", BST_SPEC, "-n", 1).stdout
    assert "history          int64   sparse     count   2: 17704 37473" in out
    assert "position         int64   sparse     count   2: 31 31" in out


def test_preview_shows_a_misaligned_slot(tmp_path: Path):
    # The spec forgets 'position': every later slot is shifted by one.
    spec = BST_SPEC.replace("position:int64,target:", "target:", 1)
    result = datafeed(
        "preview", BST, "--pipe", BST_READER, "--slots", spec, "-n", 1, check_status=1
    )
    out = result.stdout
    assert (
        f"record 1: BAD LINE {BST}:1: expected the end of the line after the last slot 'label'"
        in out
    )
    assert "  target           count   2: 31 31" in out  # position's values, seen as target's
    assert "  (trailing)       2 tokens: 1 0" in out


def test_preview_stops_reading_early_and_leaves_no_process():
    # 99 lines, 1 previewed: the reader is killed, not waited for.
    out = datafeed("preview", BST, "--pipe", BST_READER, "--slots", BST_SPEC, "-n", 1).stdout
    assert out.count("record ") == 1


def test_preview_escapes_control_characters_of_the_data(tmp_path: Path):
    """A token of the data (or a reader's stderr, or a file name) that holds
    ESC, a backspace, a C1 control or a right-to-left override reaches the
    terminal escaped, never as the control sequence; printable Unicode stays."""
    path = tmp_path / "evil\x1b]0;title\x07.txt"
    path.write_bytes(
        "1 \x1b[2J\x1b[31mred\x08\x9b0m\r 1 0\n1 caf\u00e9\u202egnp 1 0\n".encode()
    )
    result = datafeed("preview", path, "--slots", "ids:uint64,label:int64:1", check_status=1)
    out = result.stdout
    assert not set(out) & {"\x1b", "\x07", "\x08", "\x9b", "\r", "\u202e"}, out
    assert "== " + str(tmp_path) + "/evil\\x1b]0;title\\x07.txt (pipe: cat) ==" in out
    assert "  ids    count   1: \\x1b[2J\\x1b[31mred\\x08\\x9b0m\n" in out
    assert "  ids    count   1: caf\u00e9\\u202egnp\n" in out
    failed = datafeed(
        "preview", path, "--pipe", "printf '\\033[2Jboom' >&2; exit 3",
        "--slots", "ids:uint64,label:int64:1", check_status=1,
    )
    assert "\x1b" not in failed.stderr and "\\x1b[2Jboom" in failed.stderr


# -- check -------------------------------------------------------------------------------


def test_check_real_samples_with_their_readers_is_clean():
    result = datafeed("check", CRITEO_RAW, "--pipe", CRITEO_READER, "--slots", CRITEO_SPEC)
    lines = CRITEO_RAW.read_bytes().count(b"\n") + (not CRITEO_RAW.read_bytes().endswith(b"\n"))
    assert f"{CRITEO_RAW}: {lines} lines, {lines} records, 0 bad" in result.stdout
    assert result.stdout.rstrip().splitlines()[-1].startswith(
        f"OK: 1 files, {lines} lines, {lines} records, 0 bad lines, 0 reader errors"
    )
    datafeed("check", BST, "--pipe", BST_READER, "--slots", BST_SPEC)


def test_check_reports_every_bad_line(bad_file: Path):
    result = datafeed("check", bad_file, "--slots", "ids:uint64,label:int64:1", check_status=1)
    out = result.stdout.splitlines()
    reported = [re.match(rf"{re.escape(str(bad_file))}:(\d+): ", line) for line in out]
    assert [int(m[1]) for m in reported if m] == BAD_LINES
    assert f"{bad_file}:3: slot 'label': expected an integer, found b'x'" in out
    assert f"{bad_file}:6: expected a record, found a blank line" in out
    assert (
        f"{bad_file}:29: slot 'label': expected a value count of 1 (a dense slot of "
        "shape (1,)), found b'2'" in out
    )
    assert (
        f"{bad_file}: 30 lines, 18 records, 12 bad "
        "(blank_line=1, dense_count_mismatch=10, not_a_number=1)" in out
    )
    assert out[-1].startswith("FAILED: 1 files, 30 lines, 18 records, 12 bad lines")


def test_check_json_through_a_pipe_command_and_gzip(bad_file: Path, tmp_path: Path):
    gz = tmp_path / "bad.txt.gz"
    gz.write_bytes(gzip.compress(bad_file.read_bytes()))
    good = tmp_path / "good.txt"
    good.write_text("1 7 1 0\n2 8 9 1 1\n")
    result = datafeed(
        "check", good, gz, "--pipe", "cat | cat", "--slots", "ids:uint64,label:int64:1",
        "--json", check_status=1,
    )
    report = json.loads(result.stdout)
    assert report["files"] == 2 and report["lines"] == 32 and report["records"] == 20
    assert report["bad_lines"] == 12
    assert [b["line"] for b in report["bad"]] == BAD_LINES
    assert {b["file"] for b in report["bad"]} == {str(gz)}
    first = report["bad"][0]
    assert (first["slot"], first["token"]) == ("label", "x")
    assert report["per_file"][0] == {
        "file": str(good), "lines": 2, "records": 2, "bad_lines": 0, "reasons": {},
        "reader_error": None,
    }


def test_check_reports_a_failing_reader(tmp_path: Path, bad_file: Path):
    result = datafeed(
        "check", bad_file, "--pipe", "head -n 2; echo boom >&2; exit 3",
        "--slots", "ids:uint64,label:int64:1", check_status=1,
    )
    assert "reader failed: command" in result.stdout and "exited with status 3" in result.stdout
    assert "boom" in result.stdout
    assert "1 reader errors" in result.stdout


def test_check_keeps_the_first_examples_and_counts_the_rest(bad_file: Path):
    result = datafeed(
        "check", bad_file, "--slots", "ids:uint64,label:int64:1", "--examples", 3,
        check_status=1,
    )
    out = result.stdout.splitlines()
    assert out[:3] == [
        f"{bad_file}:3: slot 'label': expected an integer, found b'x'",
        f"{bad_file}:6: expected a record, found a blank line",
        f"{bad_file}:11: slot 'label': expected a value count of 1 (a dense slot of "
        "shape (1,)), found b'2'",
    ]
    assert out[3] == "... and 9 more bad lines, counted by reason below (--examples N shows more)"
    assert out[4].startswith(f"{bad_file}: 30 lines, 18 records, 12 bad (")
    assert out[-1].startswith("FAILED: 1 files, 30 lines, 18 records, 12 bad lines")
    report = json.loads(datafeed(
        "check", bad_file, "--slots", "ids:uint64,label:int64:1", "--examples", 0, "--json",
        check_status=1,
    ).stdout)
    assert (report["bad_lines"], report["bad_shown"], report["bad"]) == (12, 0, [])
    assert sum(report["per_file"][0]["reasons"].values()) == 12


def test_check_memory_stays_bounded_whatever_the_number_of_bad_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    """Each bad line kept in full costs hundreds of bytes: 20,000 of them must
    not make the report grow (only the first examples are kept)."""
    import tracemalloc

    from datafeed.cli.commands import main

    path = tmp_path / "all_bad.txt"
    path.write_bytes(b"1 5 1 x\n" * 20_000)
    tracemalloc.start()
    try:
        status = main(["check", str(path), "--slots", "ids:uint64,label:int64:1", "--json"])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    report = json.loads(capsys.readouterr().out)
    assert status == 1 and report["bad_lines"] == 20_000
    assert peak < 1_500_000, f"{peak} bytes traced at the peak"
    assert report["per_file"][0]["reasons"] == {"not_a_number": 20_000}
    assert len(report["bad"]) == report["bad_shown"] == 100
    assert report["bad"][-1]["line"] == 100


def test_check_escapes_control_characters_of_a_failing_reader(bad_file: Path):
    result = datafeed(
        "check", bad_file, "--pipe", "printf '\\033]0;owned\\007' >&2; exit 3",
        "--slots", "ids:uint64,label:int64:1", check_status=1,
    )
    assert "\x1b" not in result.stdout and "\x07" not in result.stdout
    assert "\\x1b]0;owned\\x07" in result.stdout


# -- stats -------------------------------------------------------------------------------


def test_stats_bst_per_slot_counts():
    result = datafeed("stats", BST, "--pipe", BST_READER, "--slots", BST_SPEC, "--json")
    report = json.loads(result.stdout)
    assert (report["files"], report["lines"], report["records"]) == (1, 99, 99)
    assert report["skipped_lines"] == 0
    assert report["lines_per_second"] > 0 and report["input_mb"] == pytest.approx(
        BST.stat().st_size / 1e6, rel=1e-3
    )
    # What the reader makes of the file, computed independently of it.
    rows = [line.split() for line in BST.read_text().splitlines() if line.strip()]
    history = [[t for t in row if t.startswith("history:")] for row in rows]
    lengths = [max(len(h), 1) for h in history]
    distinct = {t.split(":")[1] for h in history for t in h}
    if min(map(len, history)) == 0:
        distinct.add("0")
    by_slot = {s["slot"]: s for s in report["slots"]}
    assert by_slot["history"]["values"] == sum(lengths)
    assert by_slot["history"]["min_per_record"] == min(lengths)
    assert by_slot["history"]["max_per_record"] == max(lengths)
    assert by_slot["history"]["mean_per_record"] == pytest.approx(sum(lengths) / 99, abs=1e-4)
    assert by_slot["history"]["distinct"] == len({int(v) for v in distinct})
    assert by_slot["userid"]["distinct"] == len({row[0] for row in rows})
    assert by_slot["label"]["kind"] == "dense[1]"


def test_stats_text_output_and_skipped_lines(bad_file: Path):
    out = datafeed("stats", bad_file, "--slots", "ids:uint64,label:int64:1").stdout
    assert out.startswith("1 files, 30 lines, 18 records, 12 skipped lines\n")
    assert "lines/s" in out
    assert any(
        line.split()[:2] == ["ids", "uint64"] and line.split()[-1] == "18"
        for line in out.splitlines()
    )


def test_stats_reads_whole_files_unless_told_it_may_split(tmp_path: Path):
    # A reader that skips its file's first line loses one record per extra
    # byte range: with -j 4 over one 9 MiB file it reads the file whole.
    path = tmp_path / "big.txt"
    lines = 1_200_000  # 8 bytes each: past the 8 MiB a split needs
    path.write_text("header\n" + "1 5 1 0\n" * lines)
    spec = "ids:uint64,label:int64:1"

    def records(*flags: str) -> int:
        result = datafeed("stats", path, "--pipe", "tail -n +2", "--slots", spec, "-j", "4",
                          "--json", *flags)
        return json.loads(result.stdout)["records"]

    assert records() == lines
    assert records("--split-files") < lines  # what the default prevents


# -- convert -----------------------------------------------------------------------------


def test_convert_to_parquet_matches_the_dataset(tmp_path: Path):
    out = tmp_path / "out"
    result = datafeed("convert", BST, "--pipe", BST_READER, "--slots", BST_SPEC, "--out", out)
    wrote = f"wrote 99 records (0 lines skipped) from 1 files to {out / 'data.parquet'}"
    assert wrote in result.stdout
    table = pq.read_table(out / "data.parquet")
    dataset = InMemoryDataset()
    dataset.init(use_var=parse_slots(BST_SPEC), pipe_command=BST_READER)
    dataset.set_filelist([str(BST)])
    dataset.load_into_memory()
    assert table.to_pylist() == dataset.to_arrow().to_pylist()
    assert parse_slots(out / "slots.txt") == parse_slots(BST_SPEC)


def test_convert_to_a_cache_that_load_cache_reads(tmp_path: Path, bad_file: Path):
    out = tmp_path / "out"
    spec = "ids:uint64,label:int64:1"
    result = datafeed(
        "convert", bad_file, "--slots", spec, "--out", out, "--format", "arrow", check_status=1
    )
    assert "line 3, slot 'label': expected an integer, found b'x'" in result.stderr
    assert not out.exists()  # nothing half-written
    datafeed(
        "convert", bad_file, "--slots", spec, "--out", out, "--format", "arrow",
        "--on-bad-line", "skip",
    )
    dataset = InMemoryDataset()
    # The reader settings of the conversion: the cache records them.
    dataset.init(use_var=parse_slots(out / "slots.txt"), on_bad_line="skip")
    dataset.set_filelist([str(bad_file)])
    dataset.load_cache(out / "data.arrow")
    assert dataset.stats().records == 18 and dataset.stats().skipped_lines == 12
    ids = [row["ids"][0] for row in dataset.to_arrow().to_pylist()]
    assert ids == [i for i in range(30) if i + 1 not in BAD_LINES]


# -- the documentation -------------------------------------------------------------------


def test_the_examples_of_docs_cli_md_run():
    text = (REPO / "docs" / "cli.md").read_text()
    examples = re.findall(r"^\$ datafeed (.*?)\s+# (\d+)$", text, flags=re.MULTILINE)
    assert len(examples) >= 4
    for command, status in examples:
        result = datafeed(*shlex.split(command), check_status=int(status))
        assert result.stdout
    for shown in re.findall(r"^(examples/data/real/\S+:\d+: .*)$", text, flags=re.MULTILINE):
        path = shown.split(":", 1)[0]
        spec = "dense_feature:float32:13,C1..C26:uint64,label:int64:1"
        assert shown in datafeed("check", path, "--slots", spec, check_status=1).stdout


def test_progress_bars_on_request(bad_file: Path):
    spec = "ids:uint64,label:int64:1"
    shown = datafeed("stats", bad_file, "--slots", spec, "--progress").stderr
    assert "loading" in shown and "file" in shown
    shown = datafeed("check", bad_file, "--slots", spec, "--progress", check_status=1).stderr
    assert "checking" in shown
    quiet = datafeed("check", bad_file, "--slots", spec, "--no-progress", check_status=1).stderr
    assert "checking" not in quiet


def _real_sample_table() -> list[tuple[str, str, str]]:
    """(sample, reader, slots) rows of examples/real_samples/README.md."""
    rows = []
    for line in (REPO / "examples/real_samples/README.md").read_text().splitlines():
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and "." in cells[0] and cells[1].endswith(".py"):
            reader = cells[1] if "/" in cells[1] else f"examples/real_samples/{cells[1]}"
            rows.append((cells[0], reader, cells[2]))
    return rows


def test_every_real_sample_has_a_reader_in_the_table():
    listed = {sample for sample, _, _ in _real_sample_table()}
    on_disk = {p.name for p in REAL_DATA.iterdir() if p.name != "README.md"}
    assert listed == on_disk


@pytest.mark.parametrize("sample,reader,slots", _real_sample_table(), ids=lambda v: str(v)[:24])
def test_every_real_sample_checks_clean_with_its_reader(sample: str, reader: str, slots: str):
    path = REAL_DATA / sample
    data = path.read_bytes()
    lines = data.count(b"\n") + (not data.endswith(b"\n"))  # a last line without one counts
    pipe = f"{sys.executable} {REPO / reader}"
    checked = datafeed("check", path, "--pipe", pipe, "--slots", slots)
    assert f"OK: 1 files, {lines} lines, {lines} records, 0 bad lines" in checked.stdout
    report = json.loads(datafeed("stats", path, "--pipe", pipe, "--slots", slots, "--json").stdout)
    assert (report["records"], report["skipped_lines"]) == (lines, 0)
    assert [s["slot"] for s in report["slots"]] == [s.name for s in parse_slots(slots)]
