"""Checkpoint: roundtrip, checksum, truncation, versions and migrations, atomic writes, the
corrupt-file policy and the cross-process lock."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from driver.api.errors import CheckpointError
from kubeletplugin import checkpoint as cp
from kubeletplugin.checkpoint import (
    Checkpoint,
    CheckpointStore,
    ClaimRecord,
    DeviceRecord,
    Timeout,
    checksum,
    decode,
    encode,
)
from kubeletplugin.mps import MpsDaemon

DEVICE = DeviceRecord(
    request_names=("r0",),
    pool="node-a",
    device="gpu-0",
    cdi_device_ids=("k8s.gpu.biaxial.dev/gpu=u1-gpu-0",),
    share_id="share-1",
    gpu_uuid="GPU-0",
    exclusive=False,
    memory_bytes=4 << 30,
    cores=25,
    strategy="mps",
)
RECORD = ClaimRecord(
    uid="u1",
    namespace="ns",
    name="c1",
    state="PrepareCompleted",
    devices=(DEVICE,),
    cdi_spec_file="k8s.gpu.biaxial.dev-gpu_u1.json",
    cdi_spec={"cdiVersion": "0.3.0", "kind": "k8s.gpu.biaxial.dev/gpu", "devices": []},
    mps_daemons=(
        MpsDaemon(
            directory=Path("/run/biaxial/mps/u1/gpu-0"),
            gpu_uuid="GPU-0",
            memory_bytes=4 << 30,
            cores=25,
        ),
    ),
)
SAMPLE = Checkpoint(boot_id="boot-1", claims={"u1": RECORD})


def envelope(version: int, data: Any) -> bytes:
    return json.dumps({"version": version, "checksum": checksum(data), "data": data}).encode()


def test_roundtrip(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    assert store.load() == Checkpoint()
    store.save(SAMPLE)
    assert store.load() == SAMPLE
    raw = json.loads(store.path.read_bytes())
    assert raw["version"] == cp.CURRENT_VERSION == 4
    assert raw["checksum"] == checksum(raw["data"])


def test_checksum_is_over_the_canonical_form_not_the_formatting(tmp_path: Path) -> None:
    raw = json.loads(encode(SAMPLE))
    reformatted = json.dumps(raw, indent=8).encode()  # key order and whitespace differ
    assert decode(reformatted, tmp_path / "x") == SAMPLE


def test_checksum_mismatch_is_a_checkpoint_error_naming_the_file(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    store.save(SAMPLE)
    raw = json.loads(store.path.read_bytes())
    raw["data"]["claims"]["u1"]["devices"][0]["cores"] = 5  # edited behind our back
    store.path.write_text(json.dumps(raw))
    with pytest.raises(CheckpointError) as info:
        store.load()
    message = str(info.value)
    assert str(store.path) in message
    assert "checksum mismatch" in message
    assert "Prepare is refused" in message


def test_truncated_file_is_reported_kept_in_place_and_copied_aside_once(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    store.save(SAMPLE)
    content = store.path.read_bytes()[:40]
    store.path.write_bytes(content)
    for _ in range(2):
        with pytest.raises(CheckpointError, match="not valid JSON"):
            store.load()
    assert store.path.read_bytes() == content  # never discarded
    asides = sorted(tmp_path.glob("checkpoint.json.corrupt-*"))
    assert len(asides) == 1
    assert asides[0].read_bytes() == content


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"[]", "not a checkpoint"),
        (b'{"version": 1}', "not a checkpoint"),
        (envelope(5, {}), "unsupported version 5"),
        (envelope(0, {}), "unsupported version 0"),
        (json.dumps({"version": "2", "checksum": "", "data": {}}).encode(), "not an integer"),
        (envelope(3, {"claims": {"u1": {"uid": "u1"}}}), "malformed content for version 3"),
        (envelope(3, {"claims": {"u2": RECORD.to_json()}}), "holds uid 'u1'"),
        (
            envelope(3, {"claims": {"u1": {**RECORD.to_json(), "state": "Prepared"}}}),
            "unknown claim state",
        ),
        (b"\xff\xfe", "not valid JSON"),
        (
            envelope(3, {"claims": {"u1": {**RECORD.to_json(), "cdiSpecFile": "../../etc/x"}}}),
            "is not a plain file name",
        ),
        (
            envelope(
                3,
                {
                    "claims": {
                        "u1": {
                            **RECORD.to_json(),
                            "mpsDaemons": [{"dir": "/run/../etc", "gpuUuid": "GPU-0"}],
                        }
                    }
                },
            ),
            "is not a plain absolute path",
        ),
    ],
)
def test_bad_content(tmp_path: Path, content: bytes, message: str) -> None:
    with pytest.raises(CheckpointError, match=message):
        decode(content, tmp_path / "checkpoint.json")


@pytest.mark.parametrize("depth", [5_000, 100_000])
def test_a_deeply_nested_file_is_a_checkpoint_error_not_a_crash(tmp_path: Path, depth: int) -> None:
    """Measured before (issue 29, item 7): RecursionError escaped and the plugin exited; a
    checkpoint error makes it not-ready with the reason instead, as a corrupt file does."""
    data = f'{{"claims": {{"u1": {"[" * depth}{"]" * depth}}}}}'
    content = f'{{"version": 4, "checksum": "0", "data": {data}}}'.encode()
    with pytest.raises(CheckpointError, match="nested too deeply to read"):
        decode(content, tmp_path / "checkpoint.json")


def test_migration_from_v1(tmp_path: Path) -> None:
    v1_data = {
        "preparedClaims": {
            "u9": {
                "namespace": "team",
                "name": "train",
                "cdiSpecFile": "k8s.gpu.biaxial.dev-gpu_u9.json",
                "devices": [
                    {
                        "requestNames": ["gpus"],
                        "pool": "node-a",
                        "device": "gpu-1",
                        "cdiDeviceIds": ["k8s.gpu.biaxial.dev/gpu=u9-gpu-1"],
                    }
                ],
            }
        }
    }
    store = CheckpointStore(tmp_path)
    store.path.write_bytes(envelope(1, v1_data))
    migrated = store.load()
    assert migrated.boot_id is None  # unknown: the next call re-prepares
    record = migrated.claims["u9"]
    assert record.state == "PrepareCompleted"
    assert (record.namespace, record.name) == ("team", "train")
    assert record.cdi_spec_file == "k8s.gpu.biaxial.dev-gpu_u9.json"
    (device,) = record.devices
    assert device.exclusive
    assert device.share_id is None
    assert device.strategy == "none"
    assert device.cdi_device_ids == ("k8s.gpu.biaxial.dev/gpu=u9-gpu-1",)
    # Saving writes the current version.
    store.save(migrated)
    assert json.loads(store.path.read_bytes())["version"] == 4
    assert store.load() == migrated


def test_migration_from_v2_keeps_the_shared_per_gpu_daemon(tmp_path: Path) -> None:
    """Version 2 ran one MPS daemon per GPU, shared by every claim on it, at
    ``<root>/<GPU UUID>``; the claims prepared with it keep it, found in their CDI spec."""

    def v2_record(uid: str) -> dict[str, Any]:
        pipe = {"hostPath": "/run/biaxial/mps/GPU-0/pipe", "containerPath": "/tmp/nvidia-mps"}
        raw = {**RECORD.to_json(), "uid": uid}
        del raw["mpsDaemons"]
        raw["mpsGpus"] = ["GPU-0"]
        raw["devices"] = [{k: v for k, v in DEVICE.to_json().items() if k != "adminAccess"}]
        raw["cdiSpec"] = {
            "cdiVersion": "0.3.0",
            "kind": "k8s.gpu.biaxial.dev/gpu",
            "devices": [{"name": f"{uid}-gpu-0", "containerEdits": {"mounts": [pipe]}}],
        }
        return raw

    data = {"bootId": "b", "claims": {"u1": v2_record("u1"), "u2": v2_record("u2")}}
    migrated = decode(envelope(2, data), tmp_path / "checkpoint.json")
    assert migrated.boot_id == "b"
    for uid in ("u1", "u2"):
        record = migrated.claims[uid]
        assert record.mps_daemons == (
            MpsDaemon(directory=Path("/run/biaxial/mps/GPU-0"), gpu_uuid="GPU-0"),
        )
        assert record.devices[0].admin_access is False
    no_mount = v2_record("u3")
    no_mount["cdiSpec"] = {}
    with pytest.raises(CheckpointError, match="no MPS pipe mount for GPU GPU-0"):
        decode(envelope(2, {"bootId": None, "claims": {"u3": no_mount}}), tmp_path / "c")


def test_migration_from_v3_knows_no_mig_instances(tmp_path: Path) -> None:
    v3_claim = {k: v for k, v in RECORD.to_json().items() if k != "mig"}
    store = CheckpointStore(tmp_path)
    store.path.write_bytes(envelope(3, {"bootId": "boot-7", "claims": {"u1": v3_claim}}))
    migrated = store.load()
    assert migrated.boot_id == "boot-7"
    assert migrated.claims["u1"] == RECORD
    assert migrated.claims["u1"].mig == ()
    assert migrated.owned_instances() == frozenset()


def test_mig_records_roundtrip_and_name_what_is_owned(tmp_path: Path) -> None:
    made = cp.MigRecord(device="gpu-0-mig-3g40gb-4", gpu_uuid="GPU-0", profile="3g.40gb", start=4)
    record = dataclasses.replace(RECORD, mig=(made, dataclasses.replace(made, uuid="MIG-1")))
    store = CheckpointStore(tmp_path)
    store.save(cp.Checkpoint(boot_id="b", claims={"u1": record}))
    loaded = store.load()
    assert loaded.claims["u1"].mig == record.mig
    assert loaded.owned_instances() == frozenset({("GPU-0", "3g.40gb", 4)})
    assert loaded.mig_records(excluding="u1") == ()
    bad = {**record.to_json(), "mig": [{**made.to_json(), "start": -1}]}
    with pytest.raises(CheckpointError, match="is not a placement"):
        decode(envelope(4, {"bootId": "b", "claims": {"u1": bad}}), tmp_path / "c.json")


def test_every_old_version_has_a_migration() -> None:
    assert set(cp.MIGRATIONS) == set(range(1, cp.CURRENT_VERSION))


def test_crash_during_save_keeps_the_previous_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = CheckpointStore(tmp_path)
    store.save(SAMPLE)
    before = store.path.read_bytes()

    def crash(self: Path, other: Path) -> Path:
        raise KeyboardInterrupt  # the process dies between fsync and rename

    monkeypatch.setattr(Path, "replace", crash)
    with pytest.raises(KeyboardInterrupt):
        store.save(Checkpoint(boot_id="boot-2"))
    monkeypatch.undo()
    assert store.path.read_bytes() == before
    assert store.load() == SAMPLE
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.json"]


HOLDER = """
import sys
from filelock import FileLock
lock = FileLock(sys.argv[1], thread_local=False)
with lock:
    print("locked", flush=True)
    sys.stdin.readline()
"""


def test_lock_excludes_another_process(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, lock_timeout_s=0.2)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(store.lock_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(Timeout), store.lock():
            pytest.fail("acquired a lock another process holds")
    finally:
        assert holder.stdin is not None
        holder.stdin.write("\n")
        holder.stdin.close()
        holder.wait(timeout=10)
        if holder.stdout is not None:
            holder.stdout.close()
    with store.lock():
        store.save(SAMPLE)
    assert store.lock_path.name == "serialize.lock"
