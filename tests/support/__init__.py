"""What the tests share: the meshplane command and its environments, mesh nodes' status and queues.

Test modules import from here (and from ``tests.helpers`` for waiting), never from one another.
"""
