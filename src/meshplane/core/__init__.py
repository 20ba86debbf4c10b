"""The sans-I/O core: names, envelope, framing, discovery records and sequence tracking.

Nothing in this package touches a socket, a file or a clock it was not handed.
"""
