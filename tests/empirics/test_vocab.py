"""The vocabularies (`empirics.vocab`): the strings stored records hold, their fixed order, the display names,
and how the claims registry reads the landscape experiment's verdict words."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from empirics.vocab import (
    ATTACKS,
    DATASETS,
    MODEL_KINDS,
    PAPER_ATTACKS,
    PAPER_PAIR,
    Attack,
    Dataset,
    LandscapeVerdict,
    Model,
    dataset_label,
    model_name,
    model_short,
)
from ntkm import codec
from verify.claims.base import HOLDS, NA, NOT, PARTLY, verdict_of

BASELINE = Path(__file__).resolve().parents[1] / "data" / "smoke-claims-43279c4.json.gz"


@pytest.fixture(scope="module")
def baseline() -> dict:
    return json.loads(gzip.decompress(BASELINE.read_bytes()))


def test_values_are_the_strings_of_stored_records(baseline):
    cfg = baseline["results"]["malleability:mnist:10class@proper"]["config"]
    assert list(PAPER_ATTACKS) == cfg["attacks"] and list(PAPER_PAIR.paper_order) == cfg["models"]
    assert {baseline["results"][f"kappa:{d}"]["dataset"] for d in DATASETS} == {"mnist", "cifar10"}
    # the order seeds each attack (empirics.experiments.malleability)
    assert ATTACKS == ("fgsm", "pgd", "mim", "random")
    assert MODEL_KINDS == ("relu", "attn", "softmax", "qkv")


def test_members_equal_their_values_and_store_as_them():
    assert Attack.PGD == "pgd" and {Model.ATTN: 1}["attn"] == 1 and f"{Dataset.CIFAR10}" == "cifar10"
    assert codec.dumps({Attack.MIM: [Model.RELU, Dataset.MNIST]}) == codec.dumps({"mim": ["relu", "mnist"]})


def test_display_names():
    assert [dataset_label(d) for d in DATASETS] == ["MNIST", "CIFAR-10"]
    assert [model_short(m) for m in MODEL_KINDS] == ["ReLU", "Attn", "softmax", "qkv"]
    assert [model_name(m) for m in PAPER_PAIR.paper_order] == ["2L-ReLU", "MLP-Attn"]
    assert dataset_label("user.npz") == "user.npz" and model_name("cnn") == "cnn"


def test_landscape_words_read_as_claims_verdicts(baseline):
    stored = {baseline["results"][f"landscape:{d}@{p}"]["verdict"]["verdict"] for d in DATASETS
              for p in ("paper", "proper")}
    assert stored <= {v.value for v in LandscapeVerdict}
    assert [verdict_of(v) for v in LandscapeVerdict] == [HOLDS, PARTLY, NOT, NA]
    assert verdict_of("holds (corrected)") == PARTLY and verdict_of("check crashed") == NA
