"""experiments.run.metadata records the commit a run measured, and whether the tree had uncommitted changes, as git tells."""

import subprocess

import pytest

from experiments.run import metadata


def git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.invalid", "-c", "commit.gpgsign=false",
                           *args], check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path):
    git(tmp_path, "init", "--quiet", "--initial-branch=trunk")
    (tmp_path / ".gitignore").write_text("results/\n")
    (tmp_path / "rules.rego").write_text("package a\n")
    git(tmp_path, "add", ".")
    git(tmp_path, "commit", "--quiet", "-m", "first")
    return tmp_path


def test_a_clean_tree_records_its_commit_and_branch_allowed(repo):
    (repo / "results").mkdir()
    (repo / "results" / "run.csv").write_text("ignored: not a change\n")
    assert metadata.git_commit(repo) == {"commit": git(repo, "rev-parse", "HEAD"), "branch": "trunk", "dirty": False, "changes": []}


def test_a_changed_or_new_file_makes_the_tree_dirty_allowed(repo):
    (repo / "rules.rego").write_text("package b\n")
    recorded = metadata.git_commit(repo)
    assert recorded["commit"] == git(repo, "rev-parse", "HEAD") and recorded["dirty"] is True
    assert recorded["changes"] == [" M rules.rego"]
    git(repo, "checkout", "--quiet", "--", "rules.rego")
    (repo / "new.rego").write_text("package c\n")
    assert metadata.git_commit(repo)["changes"] == ["?? new.rego"]


def test_a_detached_head_has_no_branch_allowed(repo):
    commit = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "--quiet", "--detach")
    assert metadata.git_commit(repo) == {"commit": commit, "branch": None, "dirty": False, "changes": []}


def test_outside_a_repository_nothing_is_recorded_denied(tmp_path):
    folder = tmp_path / "not-a-repo"
    folder.mkdir()
    # GIT_CEILING_DIRECTORIES keeps git from finding a repository above tmp_path.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
        assert metadata.git_commit(folder) == {"commit": None, "branch": None, "dirty": None, "changes": None}


def test_a_repository_without_commits_records_nothing_denied(tmp_path):
    git(tmp_path, "init", "--quiet")
    assert metadata.git_commit(tmp_path)["commit"] is None
