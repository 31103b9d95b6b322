"""The paper-shape pilot's runner (tools/studies/paper_pilot.py) on a tiny budget: a run stopped by SIGTERM is
committed as a resumable folder, continued from the commit alone on a "fresh machine" (its local folder gone), and
its record, with every start in it, replaces the folder in one commit."""

import gzip
import io
import json
import signal
import subprocess
import sys
import tarfile
import time

import pytest

from conftest import ROOT, SUBPROCESS_ENV

DRIVER = """
import sys
import tools.studies.paper_pilot as pp
pp.FLAGS = ("--env-id Hopper-v5 --num-envs 2 --num-steps 64 --total-timesteps {steps} --num-minibatches 2"
            " --update-epochs 1 --eval-episodes 1 --env-backend gymnasium --torch-threads 1 --checkpoint-every 2").split()
cells = pp.cells
pp.cells = lambda seeds=(1,): cells((1,))[:1]
sys.exit(pp.main(sys.argv[1:]))
"""


def git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout


def start(repo, steps, *args):
    code = DRIVER.format(steps=steps)
    return subprocess.Popen(
        [sys.executable, "-c", code, "--repo", str(repo), *args],
        cwd=ROOT,
        env={**SUBPROCESS_ENV, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.fixture
def repo(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "init")
    git(repo, "config", "user.name", "t")
    git(repo, "config", "user.email", "t@t")
    return repo


def test_a_stopped_run_continues_from_the_commit_alone(repo):
    name = "Hopper-v5__ppo__lag0__s1"
    carried = repo / "results/records/paper_pilot/in_progress" / f"{name}.tar.gz"
    proc = start(repo, 64 * 2 * 150, "--note", "first")
    deadline = time.time() + 120
    while not (repo / "runs/paper_pilot" / name / "checkpoint.pt").exists():
        assert time.time() < deadline and proc.poll() is None, proc.communicate()[0]
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode == 143, out
    assert git(repo, "ls-files").split() == [str(carried.relative_to(repo))]
    with tarfile.open(carried) as tar:
        names = set(tar.getnames())
    assert {f"{name}/checkpoint.pt", f"{name}/run.json", f"{name}/args.json", f"{name}.pilot.json"} <= names
    assert not any("prev" in n for n in names)
    step = json.loads(tarfile.open(carried).extractfile(f"{name}.pilot.json").read())["starts"][0]
    assert step["exit_code"] == 143 and step["note"] == "first"

    git(repo, "clean", "-qfdx")  # a fresh machine: only what is committed
    proc = start(repo, 64 * 2 * 150, "--note", "second")
    out = proc.communicate(timeout=300)[0]
    assert proc.returncode == 0, out
    assert "unpacked the committed folder" in out and "1 of 1 records committed" in out
    record_path = f"results/records/paper_pilot/{name}.json.gz"
    assert git(repo, "ls-files").split() == [record_path]  # the record replaced the folder, in one commit
    assert git(repo, "show", "--stat", "--format=", "HEAD").count("|") == 2
    record = json.loads(gzip.decompress((repo / record_path).read_bytes()))
    assert record["finished"] and record["scalars"]["step"] == [128 * i for i in range(1, 151)]
    assert [s["note"] for s in record["pilot"]["starts"]] == ["first", "second"]
    assert len(record["pilot"]["perf"]["update_seconds"]) == 150

    proc = start(repo, 64 * 2 * 150)  # everything committed: nothing runs
    assert proc.communicate(timeout=60)[0].strip() == "1 of 1 records committed" and proc.returncode == 0


def test_a_carried_folder_with_a_member_outside_the_run_is_refused(tmp_path):
    from tools.studies.paper_pilot import unpack

    archive = tmp_path / "Hopper-v5__ppo__lag0__s1.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        info = tarfile.TarInfo("../outside")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    with pytest.raises(SystemExit, match="unexpected member '../outside'"):
        unpack(archive, tmp_path / "runs")
    assert not (tmp_path / "outside").exists()
