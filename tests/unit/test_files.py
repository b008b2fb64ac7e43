"""complyroute/files.py: a file written whole, with the mode asked, and nothing left beside it; a
folder written whole, its files moved to their new version in one rename."""

import pytest

from complyroute.files import DATA_LINK, write_folder, write_whole


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


def versions(folder):
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("..version-"))


def test_a_folder_takes_its_new_files_in_one_rename_and_keeps_one_version_allowed(tmp_path):
    folder = tmp_path / "routes"
    assert write_folder(folder, {"entry.json": "1", "step.json": "1"}) == ["entry.json", "step.json"]
    first = versions(folder)
    with (folder / "entry.json").open() as reading:
        assert write_folder(folder, {"entry.json": "1", "step.json": "2"}) == ["step.json"]
        assert reading.read() == "1"  # opened before: the old version, whole
    assert {name: (folder / name).read_text() for name in ("entry.json", "step.json")} == {"entry.json": "1", "step.json": "2"}
    # Every name reads through DATA_LINK, which now names the one version left: the rename moved both files.
    assert all((folder / name).is_symlink() and str((folder / name).readlink()) == f"{DATA_LINK}/{name}" for name in ("entry.json", "step.json"))
    assert versions(folder) == [(folder / DATA_LINK).readlink().name] != first


def test_a_folder_whose_files_do_not_change_is_not_written_again_denied(tmp_path):
    folder = tmp_path / "routes"
    write_folder(folder, {"entry.json": "1"})
    before = versions(folder)
    assert write_folder(folder, {"entry.json": "1"}) == [] and versions(folder) == before


def test_a_folder_keeps_the_files_it_is_not_given_and_links_a_file_written_whole_before_allowed(tmp_path):
    folder = tmp_path / "routes"
    folder.mkdir()
    write_whole(folder / "old.json", "kept")  # as a deployment of before write_folder left it
    assert write_folder(folder, {"new.json": "1"}) == ["new.json"]
    assert write_folder(folder, {"old.json": "changed"}) == ["old.json"]
    assert {p.name: p.read_text() for p in folder.iterdir() if not p.name.startswith(".")} == {"old.json": "changed", "new.json": "1"}
    assert (folder / "old.json").is_symlink()
