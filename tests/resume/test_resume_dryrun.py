"""``burst resume --dry-run`` over cards, region profiles and spot settings, offline.

The store is a real S3 server on loopback (moto) holding a synthetic snapshot with
recorded memory peaks and a real lockfile. Each rendered task is parsed back with
SkyPilot's own parser, and its ``resources.ordered`` must be the planner's fitting
candidates in order; no credential value may appear anywhere in the output.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from burst.cli import main
from burst.config import load as load_config
from burst.env import lockfile
from burst.plan import cards as gpus
from burst.plan import planner
from burst.plan.replan import replan
from burst.resume.handoff import PER_TIER
from burst.store import open_store
from tests.helpers.plan_helpers import GIB, manifest, put_manifest
from tests.helpers.sky_helpers import sky_infra, sky_view

CANARY = {"AWS_ACCESS_KEY_ID": "AKIACANARY0000000001",
          "AWS_SECRET_ACCESS_KEY": "canary-secret-value-do-not-leak-1",
          "AWS_SESSION_TOKEN": "canary-session-token-do-not-leak-2",
          "HF_TOKEN": "hf_canary_token_do_not_leak_3"}
CONFIG = """
[regions.beijing]
kubernetes_spot = ["bj-karpenter"]
kubernetes = ["bj-a100"]
ssh = ["bj-lab"]
"""


@pytest.fixture(scope="module")
def lock() -> lockfile.Lockfile:
    return lockfile.build()


@pytest.fixture
def s3_run(moto_s3, monkeypatch, tmp_path, lock):
    """A run whose snapshot (L4, bf16, peaks at micro 8 and 16) and lockfile are in S3."""
    def refuse(*_args, **_kwargs):
        raise AssertionError("the dry run asked SkyPilot's catalog")
    monkeypatch.setattr(gpus, "skypilot_offerings", refuse)
    for name, value in CANARY.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("BURST_CONFIG", str(tmp_path / "none.toml"))
    monkeypatch.setenv("BURST_ENDPOINT_URL", moto_s3.endpoint)
    monkeypatch.setenv("BURST_ADDRESSING_STYLE", "path")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
    url = moto_s3.url()
    store = open_store(url)
    put_manifest(store, manifest("run", peaks={8: 3 * GIB, 16: 5 * GIB}, global_batch=64,
                                 micro=8, card="NVIDIA L4", amp="bf16", reason="oom"))
    lockfile.save(store, "run", lock)
    config = tmp_path / "config.toml"
    config.write_text(CONFIG)
    return url, config


def dry_run(*args: str):
    return CliRunner().invoke(main, ["resume", "run", "--dry-run", "--offline",
                                     "--to", "skypilot", *args])


def rendered_yaml(output: str) -> str:
    start = output.index("# burst resume run:")
    end = output.index("\ncommands")
    return output[start:end]


MATRIX = [
    (["A100"], "any", None),
    (["L4", "A100-80GB", "H100"], "any", None),
    (["A100-80GB"], "beijing", None),
    (["A100", "L40S"], "beijing", False),
    (["H100"], "us", True),
    (["A10G", "L40S"], "europe", None),
    ([], "beijing", None),
]


@pytest.mark.parametrize(("cards", "region", "spot"), MATRIX)
def test_dry_run_renders_the_planners_ordered_candidates(s3_run, cards, region, spot):
    url, config = s3_run
    flags = ["--store", url, "--region", region, "--config", str(config)]
    flags += [f"--gpu={','.join(cards)}"] if cards else []
    flags += [] if spot is None else ["--spot" if spot else "--no-spot"]
    result = dry_run(*flags, "--secret", "HF_TOKEN", "--", "python", "train.py")
    assert result.exit_code == 0, result.output
    for value in CANARY.values():
        assert value not in result.output
    text = rendered_yaml(result.output)
    task = sky_view(text)
    policy = "first" if spot is None else ("only" if spot else "never")
    fits = [p for p in replan(open_store(url), "run", cards=cards, region=region,
                              options=planner.Options(spot=policy),
                              config=load_config(config)).plans if p.fits]
    tiers = [p.target.tier for p in fits]  # the planner's order, each tier capped
    expected = [p for i, p in enumerate(fits) if tiers[:i].count(tiers[i]) < PER_TIER]
    assert len(task["resources"]) == len(expected) > 0
    for got, plan in zip(task["resources"], expected, strict=True):
        assert got["accelerators"] == {plan.target.card.name: plan.target.count}
        assert got["use_spot"] == plan.target.spot
        if plan.target.place.infra:
            assert got["infra"] == sky_infra(plan.target.place.infra)
        else:
            assert got["cloud"] is None
    spots = [r["use_spot"] for r in task["resources"]]
    public = [p.target.spot for p in expected if not p.target.place.own_capacity]
    assert public == sorted(public, reverse=True), "public spot entries come before on-demand"
    if spot is True:
        assert all(spots)
    if spot is False:
        assert not any(spots)
    config_yaml = yaml.safe_load(text)
    assert config_yaml["secrets"] == {"AWS_ACCESS_KEY_ID": None, "AWS_SECRET_ACCESS_KEY": None,
                                      "AWS_SESSION_TOKEN": None, "HF_TOKEN": None}
    recovery = config_yaml["resources"]["job_recovery"]
    assert recovery["strategy"] == "EAGER_NEXT_REGION"
    assert recovery["recover_on_exit_codes"] == [87, 88]
    assert recovery["max_restarts_on_errors"] == 0
    assert config_yaml["envs"]["BURST_MAX_RESTARTS"] == "5"  # burst's own bound
    assert config_yaml["envs"]["BURST_RUN_ID"] == "run"
    assert config_yaml["envs"]["BURST_STORE"] == url
    assert "sky jobs launch" in result.output


def test_beijing_puts_own_clusters_first_and_kubernetes_spot_only_where_labelled(s3_run):
    url, config = s3_run
    result = dry_run("--store", url, "--region", "beijing", "--config", str(config),
                     "--gpu", "A100-80GB", "--", "python", "train.py")
    assert result.exit_code == 0, result.output
    ordered = yaml.safe_load(rendered_yaml(result.output))["resources"]["ordered"]
    places = [(e.get("infra"), e["use_spot"]) for e in ordered]
    assert places[0] == ("k8s/bj-karpenter", True)
    assert ("k8s/bj-a100", True) not in places and ("ssh/bj-lab", True) not in places
    on_demand = [p for p, spot in places if not spot]
    assert on_demand[:3] == ["k8s/bj-karpenter", "k8s/bj-a100", "ssh/bj-lab"]


def test_multi_node_task_runs_torchrun_from_skypilot_variables(s3_run):
    url, _ = s3_run
    result = dry_run("--store", url, "--gpu", "A100", "--count", "2", "--nodes", "2",
                     "--", "python", "train.py", "--lr", "0.1")
    assert result.exit_code == 0, result.output
    text = rendered_yaml(result.output)
    task = sky_view(text)
    assert task["num_nodes"] == 2
    assert all(r["accelerators"] == {"A100": 2} for r in task["resources"])
    for name in ("SKYPILOT_NUM_NODES", "SKYPILOT_NODE_RANK", "SKYPILOT_NODE_IPS",
                 "SKYPILOT_NUM_GPUS_PER_NODE"):
        assert name in task["run"]
    assert "torch.distributed.run" in task["run"] and "train.py --lr 0.1" in task["run"]


def test_forced_micro_batch_and_cluster_mode_falls_back_to_on_demand(s3_run):
    url, _ = s3_run
    result = dry_run("--store", url, "--gpu", "A100", "--micro-batch", "4", "--mode", "cluster",
                     "--cluster", "mine", "--", "python", "train.py")
    assert result.exit_code == 0, result.output
    assert "cluster mode has no recovery from a preemption: on-demand candidates only" \
        in result.output
    text = rendered_yaml(result.output)
    config = yaml.safe_load(text)
    assert config["envs"]["BURST_PLAN_MICRO_BATCH"] == "4"
    assert "job_recovery" not in config["resources"] and "BURST_MAX_RESTARTS" not in config["envs"]
    assert config["resources"]["ordered"]
    assert all(r["use_spot"] is False for r in config["resources"]["ordered"])
    resources = sky_view(text)["resources"]
    assert all(not r["use_spot"] and r["job_recovery"] is None for r in resources)
    assert "sky launch -c mine" in result.output and "sky down mine" in result.output


@pytest.mark.parametrize(("args", "message"), [
    (["--to", "mars"], "--to 'mars'"),
    (["--to", "ssh://host/some/path"], "bad SSH target"),
    (["--gpu", "A1OO"], "unknown GPU"),
    (["--micro-batch", "5"], "does not split global batch"),
    (["--region", "atlantis"], "unknown region profile"),
    (["--secret", "NOT_SET_ANYWHERE"], "is not set here"),
    (["--spot", "--mode", "cluster"], "--spot needs recovery"),
])
def test_bad_input_is_one_line_without_traceback(s3_run, monkeypatch, args, message):
    url, _ = s3_run
    monkeypatch.delenv("NOT_SET_ANYWHERE", raising=False)
    result = CliRunner().invoke(main, ["resume", "run", "--dry-run", "--offline", "--store", url,
                                       *args, "--", "python", "train.py"])
    assert result.exit_code != 0
    assert message in result.output, result.output
    assert "Traceback" not in result.output
    assert result.output.strip().count("\n") == 0 or result.output.startswith("Usage")


def test_missing_run_and_local_store_are_one_line_errors(s3_run, tmp_path):
    url, _ = s3_run
    missing = CliRunner().invoke(main, ["resume", "nope", "--dry-run", "--offline", "--store",
                                        url, "--", "python", "t.py"])
    assert missing.exit_code != 0 and "no complete snapshot" in missing.output
    local = CliRunner().invoke(main, ["resume", "run", "--offline", "--store",
                                      str(tmp_path / "st"), "--", "python", "t.py"])
    assert local.exit_code != 0 and "cannot read it" in local.output
    assert "Traceback" not in missing.output + local.output


def test_a_dry_run_from_a_local_store_warns_that_a_node_could_not_read_it(s3_run, tmp_path,
                                                                        lock):
    local = open_store(str(tmp_path / "st"))
    put_manifest(local, manifest("run", peaks={8: 3 * GIB}, global_batch=64, micro=8,
                                 card="NVIDIA L4", amp="bf16", reason="oom"))
    lockfile.save(local, "run", lock)
    shown = CliRunner().invoke(main, ["resume", "run", "--dry-run", "--offline", "--store",
                                      str(tmp_path / "st"), "--", "python", "t.py"])
    assert shown.exit_code == 0, shown.output
    assert "cannot read it" in shown.output and "nothing launched" in shown.output


def test_no_command_anywhere_is_an_error(s3_run):
    url, _ = s3_run
    result = dry_run("--store", url)
    assert result.exit_code != 0 and "names no training command" in result.output


# -- the node's software and the entry point travel with the run, not with this machine ---


@pytest.fixture
def frozen_project(s3_run, tmp_path, lock):
    """A git project in tmp with its script in scripts/, frozen from there (archive cwd
    ``scripts``), as the agent freezes ``python /abs/proj/scripts/train.py``."""
    from burst.env import freeze

    url, _ = s3_run
    root = tmp_path / "proj"
    (root / "scripts").mkdir(parents=True)
    (root / "scripts" / "train.py").write_text("print('training')\n")
    (root / "data.txt").write_text("x\n")
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    result = freeze.freeze(open_store(url), "run", code_dir=root / "scripts", lock=lock)
    assert result.code_ref["cwd"] == "scripts"
    return url, root


def test_the_entry_point_becomes_relative_to_the_restored_code(frozen_project):
    url, root = frozen_project
    result = dry_run("--store", url, "--gpu", "A100", "--", "python",
                     str(root / "scripts" / "train.py"), "--data", str(root / "data.txt"))
    assert result.exit_code == 0, result.output
    task = sky_view(rendered_yaml(result.output))
    assert 'cd "$BURST_NODE_DIR/code"/scripts' in task["run"]
    assert "node run -- python train.py --data ../data.txt" in task["run"]


def test_the_rendered_task_names_no_path_of_this_machine(frozen_project, lock):
    url, root = frozen_project
    result = dry_run("--store", url, "--gpu", "A100", "--", "python",
                     str(root / "scripts" / "train.py"))
    assert result.exit_code == 0, result.output
    text = rendered_yaml(result.output)
    repo = Path(__file__).resolve().parents[2]
    for local in (str(root.parent), str(repo), str(Path.home())):
        assert local not in text, f"{local} is in the rendered task"
    envs = yaml.safe_load(text)["envs"]
    assert envs["BURST_LOCKFILE_DIGEST"] == lock.digest
    assert envs["BURST_PYTHON"] == ".".join(lock.python["version"].split(".")[:2])


def test_an_entry_point_outside_the_code_archive_is_refused_in_one_line(frozen_project,
                                                                        tmp_path):
    url, _ = frozen_project
    elsewhere = tmp_path / "elsewhere" / "train.py"
    elsewhere.parent.mkdir()
    elsewhere.write_text("print('not archived')\n")
    result = dry_run("--store", url, "--gpu", "A100", "--", "python", str(elsewhere))
    assert result.exit_code == 2
    assert "outside the run's code archive" in result.output
    assert result.output.strip().count("\n") == 0 and "Traceback" not in result.output


def test_a_relative_entry_point_the_archive_lacks_is_refused(frozen_project):
    url, _ = frozen_project
    result = dry_run("--store", url, "--gpu", "A100", "--", "python", "missing.py")
    assert result.exit_code == 2
    assert "is not in the run's code archive (relative paths start at scripts/" in result.output


def test_the_setup_heredoc_writes_the_bootstrap_byte_for_byte(s3_run, tmp_path):
    from burst.node import bootstrap

    url, _ = s3_run
    result = dry_run("--store", url, "--gpu", "A100", "--", "python", "train.py")
    assert result.exit_code == 0, result.output
    setup = sky_view(rendered_yaml(result.output))["setup"]
    head = setup.split('burst_retry "$BURST_PY3" "$BURST_NODE_DIR/bootstrap.py"')[0]
    done = subprocess.run(["bash", "-c", head], env={"PATH": "/usr/bin:/bin",
                                                     "BURST_NODE_DIR": str(tmp_path / "n")},
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    written = (tmp_path / "n" / "bootstrap.py").read_text()
    assert written == Path(bootstrap.__file__).read_text()


def test_a_dry_run_says_the_wheelhouse_is_still_to_build(s3_run, monkeypatch):
    monkeypatch.setenv("BURST_WHEELS", "all")
    url, _ = s3_run
    result = dry_run("--store", url, "--gpu", "A100", "--", "python", "train.py")
    assert result.exit_code == 0, result.output
    assert "warning: no wheelhouse for lockfile" in result.output  # not the bootstrap's text


def test_mirrors_travel_as_envs_and_credentialed_ones_as_secret_names(s3_run, monkeypatch):
    url, _ = s3_run
    mirror = "https://mirrors.example.cn/pypi/simple"
    private = "https://user:mirror-password-canary@pypi.corp.example/simple"
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("PIP_INDEX_URL", mirror)
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", private)
    result = dry_run("--store", url, "--gpu", "A100", "--", "python", "train.py")
    assert result.exit_code == 0, result.output
    assert "mirror-password-canary" not in result.output
    config = yaml.safe_load(rendered_yaml(result.output))
    assert config["envs"]["BURST_INDEX_URL"] == mirror
    assert "BURST_EXTRA_INDEX_URL" not in config["envs"]
    assert config["secrets"]["BURST_EXTRA_INDEX_URL"] is None


def test_a_store_ca_certificate_travels_as_text_never_as_a_local_path(monkeypatch, tmp_path):
    from burst.launch.task import CA_BUNDLE_ENV
    from burst.resume.handoff import Request, secret_values, task_envs

    bundle = tmp_path / "corp-ca.pem"
    pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
    bundle.write_text(pem)
    monkeypatch.setenv("BURST_CA_BUNDLE", str(bundle))
    monkeypatch.setenv("BURST_ENDPOINT_URL", "https://s3.example.internal")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    request = Request("r", "s3://bucket/runs", str(tmp_path / "local"))
    envs = task_envs(request)
    assert "BURST_CA_BUNDLE" not in envs
    assert envs[CA_BUNDLE_ENV] == pem
    assert str(tmp_path) not in " ".join(envs.values())
    assert not [w for w in secret_values(request)[1] if "ca_bundle" in w]


def test_a_store_setting_naming_a_local_key_file_stays_off_the_task_with_a_warning(
        monkeypatch, tmp_path):
    from burst.resume.handoff import Request, secret_values, task_envs

    key = tmp_path / "id_ed25519"
    key.write_text("not a real key")
    monkeypatch.setenv("BURST_SSH_IDENTITY", str(key))
    request = Request("r", "sftp://me@box.example/runs", str(tmp_path / "local"))
    assert str(tmp_path) not in " ".join(task_envs(request).values())
    assert any("identity_file" in w and "BURST_SSH_IDENTITY" in w
               for w in secret_values(request)[1])


# -- what a remote node can reach -----------------------------------------------------------


def resume_for_real(*args: str):
    return CliRunner().invoke(main, ["resume", "run", "--offline", "--to", "skypilot", *args])


def test_a_remote_resume_with_a_loopback_store_endpoint_is_refused_in_one_line(s3_run,
                                                                              monkeypatch):
    url, _ = s3_run
    monkeypatch.delenv("AWS_SESSION_TOKEN")  # long-lived keys: only the endpoint is wrong
    result = resume_for_real("--store", url, "--gpu", "A100", "--", "python", "train.py")
    assert result.exit_code == 2, result.output
    line = result.output.strip().splitlines()[-1]
    assert line.startswith("Error: BURST_ENDPOINT_URL=http://127.0.0.1:")
    assert "is a loopback address, which a remote node cannot reach" in line
    assert "--allow-private-endpoints" in line and "Traceback" not in result.output
    assert not open_store(url).list("wheels/")  # refused before anything was built


def test_with_the_flag_a_loopback_endpoint_renders_with_a_warning(s3_run):
    url, _ = s3_run
    result = dry_run("--store", url, "--gpu", "A100", "--allow-private-endpoints", "--",
                     "python", "train.py")
    assert result.exit_code == 0, result.output
    config = yaml.safe_load(rendered_yaml(result.output))
    assert config["envs"]["BURST_ENDPOINT_URL"].startswith("http://127.0.0.1:")
    assert "forwarded because of --allow-private-endpoints" in result.output


def test_a_private_mirror_is_left_out_of_a_remote_task_and_said(s3_run, monkeypatch):
    url, _ = s3_run
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("PIP_INDEX_URL", "http://192.168.1.20:3141/root/pypi/+simple/")
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "https://mirrors.example.cn/pypi/simple")
    result = dry_run("--store", url, "--gpu", "A100", "--allow-private-endpoints", "--",
                     "python", "train.py")
    assert result.exit_code == 0, result.output
    envs = yaml.safe_load(rendered_yaml(result.output))["envs"]
    assert envs["BURST_INDEX_URL"].startswith("http://192.168.1.20")  # allowed by the flag
    monkeypatch.setenv("BURST_ENDPOINT_URL", "https://s3.us-east-1.amazonaws.com")
    from burst.resume import reach

    mirrors = {"BURST_INDEX_URL": "http://192.168.1.20:3141/root/pypi/+simple/",
               "BURST_EXTRA_INDEX_URL": "http://[::1]:8080/simple https://mirrors.example.cn/s"}
    said = reach.drop_mirrors(mirrors, allowed=False)
    assert mirrors == {"BURST_EXTRA_INDEX_URL": "https://mirrors.example.cn/s"}
    assert len(said) == 2 and "is a private address it cannot reach" in said[0]


@pytest.mark.parametrize(("host", "kind"), [
    ("127.0.0.1", "loopback"), ("localhost", "loopback"), ("::1", "loopback"),
    ("169.254.169.254", "link-local"), ("10.0.3.4", "private"), ("192.168.1.2", "private"),
    ("172.20.0.1", "private"), ("100.100.100.200", "private"), ("fd00::1", "private"),
    ("s3.oss-cn-beijing-internal.aliyuncs.com", None), ("8.8.8.8", None)])
def test_addresses_only_this_network_reaches(host, kind):
    from burst.resume import reach

    assert reach.address_kind(host) == kind
