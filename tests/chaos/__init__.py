"""The fault harness (issue 36): real nodes in network namespaces, faults from a seeded schedule, and
checkers that count what was acknowledged, lost, duplicated and reordered. ``python -m tests.chaos``
runs a schedule by hand; ``test_chaos.py`` runs a short one inside the suite."""
