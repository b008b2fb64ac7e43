"""complyroute/files.py: a file written whole, with the mode asked, and nothing left beside it."""

import pytest

from complyroute.files import write_whole


def test_a_reader_of_the_old_file_reads_it_whole_and_the_new_takes_its_name_allowed(tmp_path):
    path = tmp_path / "routes.json"
    write_whole(path, "old")
    with path.open() as reading:
        write_whole(path, b"new", 0o600)
        assert reading.read() == "old"
    assert path.read_text() == "new" and path.stat().st_mode & 0o777 == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["routes.json"]  # no temporary file left


def test_a_file_that_cannot_be_replaced_fails_the_write_and_leaves_no_temporary_file_denied(tmp_path):
    (tmp_path / "ca.pem").mkdir()  # in the way: os.replace cannot put a file there
    with pytest.raises(IsADirectoryError):
        write_whole(tmp_path / "ca.pem", b"a certificate")
    assert [p.name for p in tmp_path.iterdir()] == ["ca.pem"] and (tmp_path / "ca.pem").is_dir()
