"""The web dashboard served at ``/ui`` by ``meshplane serve``: live rates, topics, rooms, consumer
groups and their lag, a message browser, and the event plane's publishers (see docs/dashboard.md)."""
