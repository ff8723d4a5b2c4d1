"""The claim-marker check of `tests/conftest.py`, run by pytester on small fake test files: an id the claims
registry lacks (on a marker or in `--claim`) fails collection naming the test, and `--claim` selects."""

from __future__ import annotations

from pathlib import Path

import pytest

CONFTEST = Path(__file__).with_name("conftest.py")

FAKE_TESTS = '''
import pytest

@pytest.mark.claim("thm4.1")
def test_known():
    pass

@pytest.mark.claim("loo")
def test_other_known():
    pass

def test_unmarked():
    pass
'''


@pytest.fixture
def fake(pytester: pytest.Pytester) -> pytest.Pytester:
    """A pytester directory with this suite's conftest and the `claim` marker registered."""
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makeini("[pytest]\naddopts = --strict-markers\nmarkers =\n    claim(id): the paper claim\n")
    return pytester


def test_a_marker_naming_an_unknown_id_fails_collection(fake: pytest.Pytester) -> None:
    fake.makepyfile(test_fake=FAKE_TESTS + '''
@pytest.mark.claim("thm9.9-not-a-claim")
def test_unknown():
    pass

@pytest.mark.claim
def test_no_id():
    pass
''')
    result = fake.runpytest("--collect-only", "-q", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*claim ids not in the claims registry*",
                                 "*test_fake.py::test_unknown: claim('thm9.9-not-a-claim')",
                                 "*test_fake.py::test_no_id: claim(None)"])
    assert "test_known" not in result.stderr.str()


def test_an_unknown_claim_option_fails_collection(fake: pytest.Pytester) -> None:
    fake.makepyfile(test_fake=FAKE_TESTS)
    result = fake.runpytest("--collect-only", "-q", "-p", "no:cacheprovider", "--claim", "thm4.1", "--claim", "thm41")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*claim ids not in the claims registry*", "*--claim thm41"])


def test_known_ids_collect_and_claim_selects_their_tests(fake: pytest.Pytester) -> None:
    fake.makepyfile(test_fake=FAKE_TESTS)
    result = fake.runpytest("-q", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=3)
    result = fake.runpytest("-q", "-p", "no:cacheprovider", "--claim", "thm4.1")
    result.assert_outcomes(passed=1, deselected=2)
    result = fake.runpytest("-q", "-p", "no:cacheprovider", "-m", "claim")
    result.assert_outcomes(passed=2, deselected=1)


def test_every_id_of_a_multi_id_marker_is_checked_and_selects(fake: pytest.Pytester) -> None:
    fake.makepyfile(test_fake=FAKE_TESTS + '''
@pytest.mark.claim("thm4.2", "flip-mnist")
def test_two_ids():
    pass
''')
    result = fake.runpytest("-q", "-p", "no:cacheprovider", "--claim", "flip-mnist")
    result.assert_outcomes(passed=1, deselected=3)
    fake.makepyfile(test_fake=FAKE_TESTS + '''
@pytest.mark.claim("thm4.2", "not-a-claim")
def test_two_ids():
    pass
''')
    result = fake.runpytest("--collect-only", "-q", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*test_fake.py::test_two_ids: claim('not-a-claim')"])
