"""course_lib.core.files: an atomic write is all or nothing for readers, for failures and for rivals."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from course_lib.core.files import atomic_path, atomic_write_bytes, atomic_write_text, leftover_temporaries
from course_lib.core.waiting import wait_until

CHUNK = 64 * 1024
CHUNKS = 16  # 1 MiB per version, written chunk by chunk


def _version(i: int) -> bytes:
    """Version ``i``: a header naming it and 1 MiB of one byte, so a mix of two versions shows."""
    return f"{i:08d}\n".encode() + bytes([65 + i % 26]) * (CHUNK * CHUNKS)


def _is_complete(data: bytes) -> bool:
    if len(data) != 9 + CHUNK * CHUNKS:
        return False
    i = int(data[:8])
    return data == _version(i)


def test_a_reader_never_sees_a_partial_file(tmp_path):
    path = tmp_path / "record.bin"
    atomic_write_bytes(path, _version(0))
    done, seen, bad, reads = threading.Event(), set(), [], [0]

    def read() -> None:
        while not done.is_set():
            try:
                data = path.read_bytes()
            except FileNotFoundError:
                bad.append("missing")
                continue
            if _is_complete(data):
                seen.add(int(data[:8]))
            else:
                bad.append(len(data))
            reads[0] += 1

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for i in range(1, 40):
            with atomic_path(path) as tmp, open(tmp, "xb") as fh:
                data = _version(i)
                for k in range(0, len(data), CHUNK):  # slowly, as a large pickle or parquet file is written
                    fh.write(data[k : k + CHUNK])
                    fh.flush()
            if i % 2:
                atomic_write_bytes(path, _version(100 + i))
            before = reads[0]
            wait_until(lambda before=before: reads[0] > before, timeout_s=30, what="the reader's next read")
    finally:
        done.set()
        reader.join(30)
    assert bad == []  # every read was one whole version
    assert len(seen) >= 20  # and the reader really read between the replacements
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "model.pkl"
    atomic_write_bytes(path, b"old")
    with pytest.raises(RuntimeError, match="the writer failed"), atomic_path(path) as tmp:
        tmp.write_bytes(b"half of a new fi")
        raise RuntimeError("the writer failed")
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


def test_a_writer_that_wrote_nothing_fails_and_changes_nothing(tmp_path):
    path = tmp_path / "store.sqlite"
    atomic_write_bytes(path, b"old")
    with pytest.raises(FileNotFoundError), atomic_path(path):
        pass
    assert path.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == [path.name]


def test_bad_content_is_refused_before_any_file_exists(tmp_path):
    with pytest.raises(TypeError):
        atomic_write_bytes(tmp_path / "a.bin", "text, not bytes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="text must be a str"):
        atomic_write_text(tmp_path / "a.txt", b"bytes")  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []


def test_text_is_written_in_the_encoding_asked(tmp_path):
    path = atomic_write_text(tmp_path / "price.txt", "₹40 per replica-hour\n")
    assert path.read_bytes() == "₹40 per replica-hour\n".encode()
    atomic_write_text(path, "₹40\n", encoding="utf-16")
    assert path.read_text(encoding="utf-16") == "₹40\n"


def _in_threads(write, n: int) -> None:
    """Run ``write(0)`` ... ``write(n - 1)`` in ``n`` threads at once and wait for all of them."""
    threads = [threading.Thread(target=write, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)


def test_two_writers_at_once_both_succeed_with_their_own_temporary_files(tmp_path):
    path = tmp_path / "churn_model.pkl"
    both_open = threading.Barrier(2, timeout=30)
    temporaries, errors = [], []

    def write(i: int) -> None:
        try:
            with atomic_path(path) as tmp, open(tmp, "xb") as fh:
                temporaries.append(tmp)
                pickle.dump({"writer": i, "payload": list(range(5000))}, fh)
                both_open.wait()  # both temporary files exist at this moment
        except Exception as exc:
            errors.append(exc)

    _in_threads(write, 2)
    assert errors == []
    assert len(set(temporaries)) == 2 and all(t.parent == tmp_path for t in temporaries)
    assert pickle.loads(path.read_bytes())["writer"] in (0, 1)
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


def test_many_writers_many_times_leave_one_complete_file(tmp_path):
    path = tmp_path / "churn_model_x.pkl"
    barrier, errors = threading.Barrier(8, timeout=30), []

    def write(i: int) -> None:
        barrier.wait()
        try:
            for _ in range(20):
                with atomic_path(path) as tmp, open(tmp, "xb") as fh:
                    pickle.dump({"writer": i, "payload": list(range(5000))}, fh)
        except Exception as exc:  # with one shared temporary name, a rename would find its file gone
            errors.append(exc)

    _in_threads(write, 8)
    assert errors == []
    assert pickle.loads(path.read_bytes())["payload"][-1] == 4999
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


def test_a_killed_writer_leaves_a_temporary_that_names_its_process(tmp_path):
    path = tmp_path / "customers.sqlite"
    ready = tmp_path / "ready"
    code = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from course_lib.core.files import atomic_path\n"
        "with atomic_path(sys.argv[1]) as tmp:\n"
        "    tmp.write_bytes(b'half')\n"
        "    Path(sys.argv[2]).write_text(str(tmp))\n"
        "    time.sleep(600)  # killed here, before the rename\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen([sys.executable, "-c", code, str(path), str(ready)], env=env)
    try:
        wait_until(lambda: ready.exists() and ready.read_text(), timeout_s=60, what="the writer's temporary")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    tmp = Path(ready.read_text())
    assert not path.exists()
    assert leftover_temporaries(path) == [(tmp, proc.pid)]
    assert leftover_temporaries(tmp_path / "other.sqlite") == []
