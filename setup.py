"""The one thing pyproject.toml cannot say yet without an experimental table: the C extensions.

Optional: where they cannot be compiled, meshplane installs without them and runs on pyzmq and Python
alone.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "meshplane.transports._native",
            ["src/meshplane/transports/_native.c"],
            optional=True,
        ),
        Extension(
            "meshplane.core._records",
            ["src/meshplane/core/_records.c"],
            libraries=["z"],
            optional=True,
        ),
        Extension(
            "meshplane.core.mesh._frames",
            ["src/meshplane/core/mesh/_frames.c"],
            depends=[
                "src/meshplane/core/mesh/dedup_ids.h",
                "src/meshplane/core/mesh/frame_layout.h",
                "src/meshplane/core/bigendian.h",
            ],
            libraries=["z"],
            optional=True,
        ),
        Extension(
            "meshplane.core.doors._nats",
            ["src/meshplane/core/doors/_nats.c"],
            depends=["src/meshplane/core/bigendian.h", "src/meshplane/core/mesh/frame_layout.h"],
            libraries=["z"],
            optional=True,
        ),
        Extension("meshplane.core.doors._mqtt", ["src/meshplane/core/doors/_mqtt.c"], optional=True),
    ]
)
