"""The typed audit record (`verify.audit.record`): a real record round-trips through `AuditRecord`, a malformed one is
a one-line `UserInputError` naming the field, an older one (without the fields later versions added) is still read,
the committed JSON schema is the generated one and validates a real record on its own (jsonschema, Draft 2020-12),
and the run header is the one the claims records carry."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from small_audit import write_inputs

from empirics.experiments.malleability import MalleabilityRecord
from empirics.records import RunHeader
from ntkm.codec import encode
from ntkm.errors import UserInputError
from verify.audit.ci import diff_records, load_schema, read_record, summary_markdown
from verify.audit.record import SCHEMA_FILE, AuditRecord, main, parse_record, record_errors, schema_text
from verify.cli import main as cli
from verify.runner import META_KEYS

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--n", "40", "--n-test", "20", "--tau", "0.2", "--steps", "2", "--baseline-seeds", "2", "--ref-width", "16",
        "--ref-epochs", "2", "--hessian-iters", "2", "--top-k", "3", "--lds-subsets", "3", "--refit-epochs", "1",
        "--refit-seeds", "2", "--outcome-targets", "4", "--attack", "fgsm,pgd", "--peers", "none", "--ensemble", "0"]


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    """A real audit of a briefly trained CNN, with every panel and the two reference networks, saved with --json."""
    import os

    os.environ["NTKM_PROGRESS"] = "0"
    d = tmp_path_factory.mktemp("audit-record")
    write_inputs(d)
    out = d / "a.pdf"
    code = cli(["audit", "--model", str(d / "cnn.ts"), "--train", str(d / "train.npz"), "--test",
                str(d / "test.npz"), *TINY, "--out", str(out), "--json", "--summary"])
    assert code in (0, 3)
    return out.with_suffix(".json")


@pytest.fixture
def raw(saved: Path) -> dict:
    return json.loads(saved.read_text())


def _dump(rec: AuditRecord) -> dict:
    """A typed record as the stored dict (the codec's representation: NaN as "nan")."""
    return encode(rec.model_dump(by_alias=True, exclude_unset=True))


def test_a_real_record_round_trips_through_the_model(raw):
    rec = AuditRecord.model_validate(raw)
    assert {"relu", "attn", "user"} <= set(rec.models) and rec.user is rec.models["user"]
    assert rec.panels.validity is not None and rec.panels.budget is not None and rec.panels.poison is not None
    assert rec.lever_classes and rec.lever_classes[0].class_ == raw["lever_classes"][0]["class"]
    first = _dump(rec)
    assert first == raw
    assert _dump(AuditRecord.model_validate(first)) == first


def test_the_readers_give_the_same_text_from_the_dict_and_the_model(raw, saved):
    rec = parse_record(raw)
    assert summary_markdown(raw) == summary_markdown(rec) == (saved.parent / "a-summary.md").read_text()
    assert diff_records(raw, raw) == diff_records(rec, rec)


@pytest.mark.parametrize(("path", "value", "field"), [
    (("models", "user", "n_selected"), "8", "$.models.user.n_selected"),
    (("risk", "level"), "severe", "$.risk.level"),
    (("panels", "validity", "lds", "ntk", "value"), [0.5], "$.panels.validity.lds.ntk.value"),
    (("config", "reference"), "yes", "$.config.reference"),
])
def test_a_wrong_type_is_one_line_naming_the_field(path, value, field, raw, tmp_path):
    node = raw
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    with pytest.raises(UserInputError) as exc:
        parse_record(raw)
    msg = str(exc.value)
    assert len(msg.splitlines()) == 1 and field in msg, msg
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(raw))
    for schema in (True, False):
        with pytest.raises(UserInputError) as exc:
            read_record(bad, "NEW", schema=schema)
        assert len(str(exc.value).splitlines()) == 1 and field in str(exc.value)


@pytest.mark.parametrize("path", [("risk", "rule"), ("models", "user", "worst_flip_rate"), ("created",)])
def test_a_missing_required_field_is_one_line_naming_it(path, raw):
    node = raw
    for key in path[:-1]:
        node = node[key]
    del node[path[-1]]
    errs = record_errors(raw)
    assert errs == [f"$.{'.'.join(path)}: missing"], errs
    with pytest.raises(UserInputError, match=r"\$\." + r"\.".join(path) + ": missing"):
        parse_record(raw)


def test_an_older_record_without_the_later_fields_is_still_read(raw, tmp_path):
    for key in ("lever_classes", "attributions", "panels", "memory", "schema_version"):
        raw.pop(key, None)
    del raw["models"]["relu"]["gate"]
    old = tmp_path / "old.json"
    old.write_text(json.dumps(raw))
    rec = parse_record(read_record(old, "--render", schema=False))
    assert rec.lever_classes is None and rec.panels.run == [] and rec.schema_version is None
    assert "schema ?" in summary_markdown(rec)


def test_the_committed_schema_is_the_generated_one(capsys):
    """Regenerate with `python -m verify.audit.record --write-schema` when the types change."""
    assert SCHEMA_FILE.read_text() == schema_text()
    assert main([]) == 0 and capsys.readouterr().out == schema_text()


def test_the_generated_schema_validates_a_real_record_independently(raw):
    from jsonschema import Draft202012Validator

    schema = load_schema()
    Draft202012Validator.check_schema(schema)
    validator = Draft202012Validator(schema)
    assert [e.message for e in validator.iter_errors(raw)] == []
    broken = copy.deepcopy(raw)
    broken["models"]["user"]["worst_flip_rate"] = 1.5
    del broken["risk"]["advice"]
    assert len(list(validator.iter_errors(broken))) == 2


def test_the_run_header_is_shared_with_the_claims_records(raw):
    assert issubclass(AuditRecord, RunHeader)
    assert AuditRecord.model_validate(raw).device.used == raw["device"]["used"]
    quick = ROOT / "results" / "claims-quick.json"
    if not quick.exists():
        pytest.skip("results/claims-quick.json is not in this checkout")
    claims = json.loads(quick.read_text())
    assert RunHeader.model_validate({k: claims[k] for k in ("versions", "device")}).device.used is None
    stored = next(v for k, v in claims["results"].items() if k.startswith("malleability:"))
    record = MalleabilityRecord.from_dict({k: v for k, v in stored.items() if k not in META_KEYS})
    assert record.header.versions == stored["versions"] and record.header.device.used == stored["device"]["used"]
