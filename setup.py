"""Packaging for MindSpeed-RL with the asynchronous ASP pipeline.

Versions are pinned per extra in `mindspeed_rl/_pins.py` (see there for why each stack pins what it
does); tests/mindspeed_rl/test_pins.py checks them against the engines' own requirements.
"""

import importlib.util
from pathlib import Path

from setuptools import find_packages, setup


def _load_pins():
    # By path, not `import mindspeed_rl`: the build runs before the package's dependencies exist,
    # and PEP 517 builds do not put this folder on sys.path.
    spec = importlib.util.spec_from_file_location(
        "_pins", Path(__file__).parent / "mindspeed_rl" / "_pins.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


pins = _load_pins()

setup(
    name="mindspeed-rl-asp",
    version="0.1.0",
    description="GRPO post-training with an asynchronous, length-scheduled (ASP) rollout pipeline",
    python_requires=">=3.10",
    packages=find_packages(include=["asp_scheduler*", "mindspeed_rl*", "cli*"]),
    include_package_data=True,
    package_data={"asp_scheduler": ["data/*"], "mindspeed_rl": ["py.typed"]},
    install_requires=pins.CORE,
    extras_require=pins.EXTRAS,
    entry_points={
        "console_scripts": [
            "asp-schedule=asp_scheduler.__main__:main",
        ]
    },
)
