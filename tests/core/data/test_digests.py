"""File digests cached in the per-user cache directory, never beside the data, keyed so that
a replaced file is hashed again, computed by one process per machine (R-SCALE-2)."""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path

import pytest

from embodichain.core.data import digests
from embodichain.core.data.digests import cache_dir, file_digest
from embodichain.core.data.identity_records import describe_change, record_identity
from embodichain.core.runs.resume_policy import resume_problems
from tests.support.files import file_listing
from tests.support.processes import mark_then_wait_for_another, two_at_once


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    hashed: list[Path] = []
    real = digests.file_sha256

    def counted(path: Path) -> str:
        hashed.append(path)
        return real(path)
    monkeypatch.setattr(digests, "file_sha256", counted)
    return hashed


def test_a_digest_is_cached_in_the_user_cache_and_nothing_beside_the_file(
        tmp_path: Path, digest_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Catches a digest cached beside the data (`<file>.sha256`, which crashed a read-only
    dataset and wrote into one during validate-config) and a cache never read back (every
    start hashing every byte again)."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.bin").write_bytes(b"x" * 1000)
    before = file_listing(data)
    hashed = _counting(monkeypatch)
    first = file_digest(data / "a.bin")
    assert first == "sha256:" + hashlib.sha256(b"x" * 1000).hexdigest()
    assert file_digest(data / "a.bin") == first
    assert hashed == [data / "a.bin"]  # the second time from the cache
    assert file_listing(data) == before
    assert list((digest_cache / "digests").rglob("*.json"))


def test_the_cache_directory_follows_the_environment(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Catches a cache directory that ignores EMBODICHAIN_CACHE_DIR or XDG_CACHE_HOME."""
    monkeypatch.delenv("EMBODICHAIN_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "home/.cache/embodichain"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg/embodichain"
    monkeypatch.setenv("EMBODICHAIN_CACHE_DIR", str(tmp_path / "own"))
    assert cache_dir() == tmp_path / "own"


def test_a_replaced_file_of_the_same_size_and_mtime_is_hashed_again(tmp_path: Path,
                                                                    digest_cache: Path) -> None:
    """Catches a cache keyed by size and mtime alone: a file replaced by another of the same
    size with its mtime set back (another inode), and a parquet table overwritten in place
    (same inode, size and mtime; another footer) must not be taken for the old one."""
    path = tmp_path / "a.bin"
    path.write_bytes(b"a" * 4096)
    stat = path.stat()
    old = file_digest(path)
    new = tmp_path / "new.bin"
    new.write_bytes(b"b" * 4096)
    os.replace(new, path)  # another inode, same path and size
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert path.stat().st_ino != stat.st_ino
    assert file_digest(path) == "sha256:" + hashlib.sha256(b"b" * 4096).hexdigest() != old

    table = tmp_path / "t.parquet"
    table.write_bytes(b"PAR1" + bytes(200_000) + b"footer-1" + (8).to_bytes(4, "little")
                      + b"PAR1")
    stat = table.stat()
    old = file_digest(table)
    with table.open("r+b") as f:  # in place: the same inode
        f.seek(stat.st_size - 16)
        f.write(b"footer-2")
    os.utime(table, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert (table.stat().st_ino, table.stat().st_size) == (stat.st_ino, stat.st_size)
    assert file_digest(table) == "sha256:" + hashlib.sha256(table.read_bytes()).hexdigest()
    assert file_digest(table) != old


def test_a_same_size_rewrite_in_place_with_another_mtime_is_hashed_again(
        tmp_path: Path, digest_cache: Path) -> None:
    """Catches a cache key without the modification time (path, size and inode only): a file
    rewritten in place (same inode) to the same size, its mtime moved on as any write moves
    it, kept its old digest, so a resume over the changed data was accepted. The mtimes are
    set explicitly, so the test does not depend on the file system's time resolution."""
    path = tmp_path / "a.bin"
    path.write_bytes(b"a" * 4096)
    os.utime(path, ns=(1_700_000_000_000_000_000, 1_700_000_000_000_000_000))
    old = file_digest(path)
    inode = path.stat().st_ino
    with path.open("r+b") as f:  # in place: the same inode and size
        f.write(b"b" * 4096)
    os.utime(path, ns=(1_700_000_005_000_000_000, 1_700_000_005_000_000_000))
    assert (path.stat().st_ino, path.stat().st_size) == (inode, 4096)
    assert file_digest(path) == "sha256:" + hashlib.sha256(b"b" * 4096).hexdigest() != old


def test_a_file_changed_while_it_is_hashed_records_no_digest(
        tmp_path: Path, digest_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Catches a digest recorded although the file changed while it was hashed (the check
    after hashing left out): the file is rewritten in place while it is hashed (another
    mtime), and later restored in place with its old bytes and mtime (`cp -p --inplace`),
    which gives it its first cache key again. With the record kept, that key would give the
    digest of the bytes read mid-change; nothing is recorded, and the restored file's
    digest is its own."""
    path = tmp_path / "a.bin"
    original = b"a" * 4096
    path.write_bytes(original)
    stamp = (1_700_000_000_000_000_000, 1_700_000_000_000_000_000)
    os.utime(path, ns=stamp)
    real = digests.file_sha256

    def changed_while_read(p: Path) -> str:
        with path.open("r+b") as f:
            f.write(b"b" * 4096)
        os.utime(path, ns=(stamp[0] + 5 * 10**9, stamp[1] + 5 * 10**9))
        return real(p)
    monkeypatch.setattr(digests, "file_sha256", changed_while_read)
    file_digest(path)
    assert not list((digest_cache / "digests").rglob("*.json"))
    monkeypatch.setattr(digests, "file_sha256", real)
    with path.open("r+b") as f:
        f.write(original)
    os.utime(path, ns=stamp)
    assert file_digest(path) == "sha256:" + hashlib.sha256(original).hexdigest()


def _ask(path: str, barrier, results) -> None:
    barrier.wait(timeout=30)
    results.put(file_digest(path))


def test_two_processes_asking_at_once_hash_the_file_once(tmp_path: Path, digest_cache: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Catches a digest computed by every rank on a node (no lock, or a lock taken after
    looking at the cache but not looking again): the hashing process writes a marker into
    the cache directory and waits for a second one to start hashing too, which with the lock
    never happens; the other waits on the lock, then reads the cached digest."""
    path = tmp_path / "big.bin"
    path.write_bytes(os.urandom(1 << 16))
    marker = tmp_path / "hashers"
    real = digests.file_sha256

    def marked(p: Path) -> str:
        mark_then_wait_for_another(marker)
        return real(p)
    monkeypatch.setattr(digests, "file_sha256", marked)
    got = two_at_once(_ask, str(path))
    assert got[0] == got[1] == "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()
    assert len(marker.read_text().split()) == 1, marker.read_text()


def test_a_cache_that_cannot_be_written_hashes_without_it_and_warns_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """Catches a crash (or a warning per file) where the cache directory cannot be created:
    the digest is still right, computed without caching."""
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    monkeypatch.setenv("EMBODICHAIN_CACHE_DIR", str(blocker / "cache"))
    monkeypatch.setattr(digests, "_warned", set())
    for name in ("a", "b"):
        (tmp_path / name).write_bytes(name.encode())
    with caplog.at_level(logging.WARNING, logger="embodichain"):
        assert file_digest(tmp_path / "a") == "sha256:" + hashlib.sha256(b"a").hexdigest()
        assert file_digest(tmp_path / "b") == "sha256:" + hashlib.sha256(b"b").hexdigest()
    warnings = [r for r in caplog.records if "cannot be written" in r.getMessage()]
    assert len(warnings) == 1 and "EMBODICHAIN_CACHE_DIR" in warnings[0].getMessage()


def test_a_resume_refused_over_the_data_names_the_files_that_changed(digest_cache: Path) -> None:
    """Catches a refusal that names two opaque identities only, where the per-file digests
    behind both were recorded on this machine."""
    record_identity("id-1", "/data", {"meta/info.json": "sha256:1", "data/a.parquet": "sha256:2",
                                      "data/b.parquet": "sha256:3"})
    record_identity("id-2", "/data", {"meta/info.json": "sha256:1", "data/a.parquet": "sha256:9",
                                      "data/c.parquet": "sha256:3"})
    assert describe_change("id-1", "id-2") == ("changed files: data/a.parquet, "
                                               "data/b.parquet, data/c.parquet")
    assert describe_change("id-1", "unknown") == ""
    run = {"world_size": 1, "source_identity": "id-2"}
    problems = resume_problems({"world_size": 1, "source_identity": "id-1", "step": 0},
                               {}, run)
    assert any("data/a.parquet" in p and "id-1" in p and "id-2" in p for p in problems)
