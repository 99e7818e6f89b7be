import pytest
import torch
from hypothesis import settings

# Tiny models gain nothing from threads, and on a shared 2-core machine OpenMP spinning slows them down.
torch.set_num_threads(1)

# Property tests check results, not speed: a loaded CI machine must not fail them on a deadline.
settings.register_profile("lookahead", deadline=None)
settings.load_profile("lookahead")


@pytest.fixture(autouse=True)
def _fresh_shared_state():
    # generate() shares a calibrator and recycled successors per model in the process (engine/shared.py);
    # tests reuse cached models, so each test starts from the priors and none depends on which tests ran
    # before it.
    from lookahead.engine.shared import reset_shared

    reset_shared()
    yield


def pytest_collection_modifyitems(config, items):
    # Run the slow real-model tests last so a quick failure elsewhere shows first.
    items.sort(key=lambda item: item.get_closest_marker("real_model") is not None)


# No test may skip: a skip hides a missing dependency (a browser, a package, the network) as a pass.
# Any skipped test or module fails the run, after the usual summary, with one line naming them.
_SKIPPED: list[str] = []


def _note_skip(report: pytest.CollectReport | pytest.TestReport) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        _SKIPPED.append(report.nodeid or str(report.fspath))


def pytest_collectreport(report: pytest.CollectReport) -> None:
    _note_skip(report)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _note_skip(report)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _SKIPPED and exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:  # noqa: ANN001
    if _SKIPPED:
        terminalreporter.write_line(
            f"error: {len(_SKIPPED)} skipped (no test may skip; install what they need): {', '.join(_SKIPPED)}",
            red=True,
        )
