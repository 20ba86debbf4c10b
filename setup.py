"""The one thing pyproject.toml cannot say yet without an experimental table: the C extension.

Optional: where it cannot be compiled, meshplane installs without it and runs on pyzmq and Python alone.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "meshplane.transports._native",
            ["src/meshplane/transports/_native.c"],
            optional=True,
        )
    ]
)
