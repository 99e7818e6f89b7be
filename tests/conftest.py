import pytest
import torch
from hypothesis import settings

# Tiny models gain nothing from threads, and on a shared 2-core machine OpenMP spinning slows them down.
torch.set_num_threads(1)

# Property tests check results, not speed: a loaded CI machine must not fail them on a deadline.
settings.register_profile("lookahead", deadline=None)
settings.load_profile("lookahead")


def pytest_collection_modifyitems(config, items):
    # Run the slow real-model tests last so a quick failure elsewhere shows first.
    items.sort(key=lambda item: item.get_closest_marker("real_model") is not None)
