import pytest

import neptune_eq  # noqa: F401  (first: selects Triton's interpreter on a CPU-only machine)


def pytest_addoption(parser):
    parser.addoption("--update-snapshots", action="store_true", help="rewrite tests/snapshots/*")


@pytest.fixture
def update_snapshots(request):
    return request.config.getoption("--update-snapshots")
