"""The contract between burst's processes, as a specification: the values on the wire are the
ones burst has always written, the plan's record survives its trip through the environment,
and the node bootstrap (which cannot import burst) spells the same names."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from burst import contract
from burst.contract import Exit, PlanEnv, Reason
from burst.store.settings import OPTIONS

BOOTSTRAP = Path(contract.__file__).parent / "node" / "bootstrap.py"
# names only the bootstrap reads: uv's download list, its pip mode, an old endpoint name
BOOTSTRAP_OWN = {"BURST_PYTHON_DOWNLOADS", "BURST_BOOTSTRAP_PIP", "BURST_S3_ENDPOINT_URL"}
# what the task hands the bootstrap: it must read each under exactly this spelling
TASK_TO_BOOTSTRAP = (contract.ENV_RUN_ID, contract.ENV_STORE, contract.ENV_LOCKFILE_DIGEST,
                     contract.ENV_PYTHON, contract.ENV_SPEC, contract.ENV_NODE_DIR,
                     contract.ENV_PYTHON_MIRROR, contract.ENV_INDEX_URL,
                     contract.ENV_EXTRA_INDEX_URL, contract.ENV_TORCH_INDEX,
                     contract.ENV_ENDPOINT_URL, contract.ENV_METADATA_URL)


def _env_names() -> set[str]:
    return {value for name, value in vars(contract).items() if name.startswith("ENV_")}


def _bootstrap_names() -> set[str]:
    tree = ast.parse(BOOTSTRAP.read_text(encoding="utf-8"))
    return {node.value for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and node.value.startswith("BURST_") and node.value.replace("_", "").isalnum()}


def test_reasons_serialize_to_the_strings_manifests_have_always_held():
    assert json.dumps({"reason": Reason.GPU_FAILURE}) == '{"reason": "gpu-failure"}'
    assert f"{Reason.OOM}" == str(Reason.OOM) == "oom"


def test_a_reason_read_back_from_a_manifest_equals_its_member():
    assert json.loads('"preemption"') == Reason.PREEMPTION
    assert Reason("signal") is Reason.SIGNAL


def test_exit_codes_keep_their_numbers():
    assert {code.name: int(code) for code in Exit} == {
        "OOM": 86, "GPU_FAILURE": 87, "STOPPED": 88, "RESTART_LIMIT": 89, "FENCED": 90,
        "SETUP_FAILED": 91, "STORE_UNREACHABLE": 92, "UPLOAD_FAILED": 93,
        "RUNS_UNREADABLE": 94}


def test_an_exit_code_prints_as_its_number():
    assert f"exit {Exit.OOM}" == "exit 86" and str(Exit.FENCED) == "90"
    assert json.dumps([Exit.STOPPED]) == "[88]"


def test_a_process_exits_with_the_codes_number():
    done = subprocess.run([sys.executable, "-c",
                           "from burst.contract import Exit; raise SystemExit(Exit.FENCED)"],
                          check=False)
    assert done.returncode == 90


def test_every_environment_name_is_spelled_once_in_the_contract():
    names = [value for name, value in vars(contract).items() if name.startswith("ENV_")]
    assert len(names) == len(set(names))
    assert all(name.startswith("BURST_") for name in names)


def test_a_full_plan_survives_the_environment():
    plan = PlanEnv(micro_batch=4, accumulation=2, world_size=2, amp="bf16",
                   grad_scaler=False, tf32=True, probe=True, probe_micro_batches=(8, 4, 2))
    assert PlanEnv.from_env(plan.to_env()) == plan


def test_a_plan_writes_the_values_the_training_side_has_always_read():
    plan = PlanEnv(micro_batch=4, accumulation=2, world_size=1, amp="none",
                   grad_scaler=True, tf32=False, probe=False, probe_micro_batches=())
    assert plan.to_env() == {
        "BURST_MICRO_BATCH": "4", "BURST_ACCUMULATION": "2", "BURST_WORLD_SIZE": "1",
        "BURST_AMP": "none", "BURST_GRAD_SCALER": "1", "BURST_TF32": "0", "BURST_PROBE": "0",
        "BURST_PROBE_MICRO_BATCHES": ""}


def test_fields_a_plan_leaves_open_are_not_in_the_environment():
    assert PlanEnv(micro_batch=2, accumulation=8).to_env() == {
        "BURST_MICRO_BATCH": "2", "BURST_ACCUMULATION": "8"}
    assert PlanEnv.from_env({}) == PlanEnv()


def test_a_number_that_is_not_one_names_its_variable():
    with pytest.raises(ValueError, match=r"\$BURST_WORLD_SIZE must be an integer, got 'two'"):
        PlanEnv.from_env({"BURST_WORLD_SIZE": "two"})


def test_probe_sizes_below_one_are_refused():
    with pytest.raises(ValueError, match="holds a size below 1"):
        PlanEnv.from_env({"BURST_PROBE_MICRO_BATCHES": "4,0"})


def test_the_contract_module_imports_nothing_but_the_standard_library():
    tree = ast.parse(Path(contract.__file__).read_text(encoding="utf-8"))
    imported = {alias.name.split(".")[0] for node in ast.walk(tree)
                if isinstance(node, ast.Import) for alias in node.names}
    imported |= {(node.module or "").split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom)}
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}


def test_the_bootstrap_reads_what_the_task_hands_it_under_the_contracts_names():
    assert set(TASK_TO_BOOTSTRAP) - _bootstrap_names() == set()


def test_every_name_the_bootstrap_spells_is_one_burst_defines():
    known = _env_names() | set(OPTIONS.values()) | BOOTSTRAP_OWN
    assert _bootstrap_names() - known == set()
