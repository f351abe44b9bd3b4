"""azure-native's packages, each name loaded from its own module when it is first read.

Reading any name of `pulumi_azure_native.network` runs the package's `__init__`, which imports every
one of its ~290 resource modules; `compute` is alike. The program uses a dozen of them, and loading
the rest cost each `superkube plan` process about 0.7 s of its 4. `load_by_name` makes each package
read a name from the module that defines it instead: the resource `Subnet` from `subnet.py`, an
argument class from `_inputs.py`, an enum from `_enums.py`, a function from its own file. A name it
cannot place (or any `__dunder__`, `__all__` included) loads the whole package as before, so every
reader, the SDK's own lookups of a type by name included, sees the package it would have seen.
"""

from __future__ import annotations

import importlib
import re
import sys
import types
from pathlib import Path
from typing import Any

import pulumi_azure_native

PACKAGES = ("authorization", "compute", "managedidentity", "network", "resources")
"""The azure-native packages the program uses."""

_SHARED = ("_enums", "_inputs")
"""Where a package keeps its enums and argument classes (every resource module imports both)."""


def _snake(name: str) -> str:
    """`VirtualMachineScaleSet` -> `virtual_machine_scale_set`."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()


def _modules_for(name: str) -> tuple[str, ...]:
    """The modules of a package that may define `name`, most likely first."""
    if name.endswith("Args") or name.endswith("ArgsDict"):
        return _SHARED[::-1]
    if name[:1].isupper():
        return (_snake(name), *_SHARED)
    return (name.removesuffix("_output"),)  # get_client_config_output lives in get_client_config.py


def _load_all(package: types.ModuleType) -> None:
    """Run the package's `__init__` as an import of it would have (once)."""
    vars(package).pop("__getattr__", None)
    spec = package.__spec__
    assert spec is not None and spec.loader is not None
    spec.loader.exec_module(package)


def _by_name(package: types.ModuleType) -> Any:
    assert package.__spec__ is not None and package.__spec__.origin is not None
    folder = Path(package.__spec__.origin).parent

    def is_module(name: str) -> bool:
        return (folder / f"{name}.py").is_file() or (folder / name / "__init__.py").is_file()

    def __getattr__(name: str) -> Any:
        if not name.startswith("__"):
            for module in (name,) if is_module(name) else _modules_for(name):
                if not is_module(module):
                    continue
                found = importlib.import_module(f"{package.__name__}.{module}")
                value = found if module == name else getattr(found, name, None)
                if value is not None:
                    setattr(package, name, value)
                    return value
        _load_all(package)
        return getattr(package, name)

    return __getattr__


def planning() -> bool:
    """Whether the program runs under the mock engine (`superkube plan`, the tests), not the real one.

    Only there are the packages loaded by name: `pulumi up` and `preview` load them whole, as the SDK
    does, so the resource modules each package registers when it loads are there for the engine."""
    from pulumi.runtime import mocks, settings

    return isinstance(settings.get_monitor(), mocks.MockMonitor)


def load_by_name(*names: str) -> None:
    """Make each of `pulumi_azure_native`'s packages `names` load a name from its own module.

    A package already loaded whole is left as it is."""
    for short in names:
        full = f"{pulumi_azure_native.__name__}.{short}"
        package = sys.modules.get(full) or importlib.import_module(full)
        namespace = types.ModuleType.__getattribute__(package, "__dict__")
        if "_utilities" in namespace or "__getattr__" in namespace:
            continue  # its `__init__` has run (it imports `_utilities`), or this has been done already
        if type(package) is not types.ModuleType:
            package.__class__ = types.ModuleType  # the SDK's lazy module: it would load all at a read
        namespace["__getattr__"] = _by_name(package)
