"""Build hook for the optional C fast path of the shm channel; metadata lives in pyproject.toml.

``optional=True``: where the extension cannot be compiled (no compiler, no
glibc), installation still succeeds and cgraph runs its pure-Python channel.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "cgraph.channels._fastpath",
            ["cgraph/channels/_fastpath.c"],
            optional=True,
            extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter", "-pthread"],
            extra_link_args=["-pthread"],
        )
    ]
)
