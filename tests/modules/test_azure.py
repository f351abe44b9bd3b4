"""azure-native's packages load a name from its own module, and the whole package for anything else.

Each case runs in a fresh interpreter: in this one another test may have loaded a package whole.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.conftest import ROOT


def run(code: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_a_name_loads_only_its_own_module() -> None:
    run(
        """
        import sys
        from modules import azure
        azure.load_by_name(*azure.PACKAGES)
        from pulumi_azure_native import authorization, compute, network
        from pulumi_azure_native.network import subnet

        assert network.Subnet is subnet.Subnet
        assert network.SecurityRuleArgs is sys.modules["pulumi_azure_native.network._inputs"].SecurityRuleArgs
        assert compute.CachingTypes.READ_ONLY == "ReadOnly"
        assert callable(authorization.get_client_config_output)
        loaded = {m for m in sys.modules if m.startswith("pulumi_azure_native.network.")}
        assert "pulumi_azure_native.network.admin_rule" not in loaded, "the package was loaded whole"
        assert len(loaded) < 20, sorted(loaded)
        """
    )


def test_a_name_it_cannot_place_loads_the_whole_package() -> None:
    run(
        """
        import sys
        from modules import azure
        azure.load_by_name(*azure.PACKAGES)
        from pulumi_azure_native import network

        network.Subnet
        try:
            network.NoSuchThing
        except AttributeError:
            pass
        else:
            raise AssertionError("an unknown name was found")
        assert "pulumi_azure_native.network.admin_rule" in sys.modules
        assert network.AdminRule is sys.modules["pulumi_azure_native.network.admin_rule"].AdminRule
        assert "__getattr__" not in vars(network)
        """
    )


def test_a_package_loaded_whole_is_left_as_it_is() -> None:
    run(
        """
        from pulumi_azure_native import network

        network.Subnet  # the SDK's lazy package, loaded whole at its first name
        from modules import azure

        azure.load_by_name("network")
        assert "__getattr__" not in vars(network)
        assert network.VirtualNetwork.__name__ == "VirtualNetwork"
        """
    )


def test_the_program_loads_by_name_under_the_mock_engine_only() -> None:
    run(
        """
        import sys
        from modules import common  # the real engine's way: the packages load whole
        from pulumi_azure_native import network

        network.Subnet
        assert "pulumi_azure_native.network.admin_rule" in sys.modules
        """
    )
    run(
        """
        import sys
        import pulumi

        class Mocks(pulumi.runtime.Mocks):
            def new_resource(self, args):
                return args.name, args.inputs

            def call(self, args):
                return {}

        pulumi.runtime.set_mocks(Mocks())
        from modules import common  # under mocks, as `superkube plan` runs the program
        from pulumi_azure_native import network

        network.Subnet
        assert "pulumi_azure_native.network.admin_rule" not in sys.modules
        """
    )
