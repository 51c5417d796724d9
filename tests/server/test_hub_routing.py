"""Under JupyterHub, a jupyter_client that does not let every kernelspec go
through ``hami-provisioner`` makes the server refuse every kernel (issue 26).

The routing rests on jupyter_client's private ``KernelProvisionerFactory.
_get_provisioner_config`` and its singleton. Each case here plays a
jupyter_client that changed them; the server must say so in its log and in
the answer to ``POST api/kernels``, and start no kernel, rather than start a
``local-provisioner`` kernel outside the hub's slice.
"""

import json
import sys

import pytest
from jupyter_client.provisioning import KernelProvisionerFactory
from tornado.httpclient import HTTPClientError

from hami_jupyter.slice.create import create_limits_file, create_slice
from hami_jupyter.slice.settings import resolve_limits



def _no_private_hook(monkeypatch):
    monkeypatch.delattr(KernelProvisionerFactory, "_get_provisioner_config")


def _own_singleton_only(monkeypatch):
    """A jupyter_client whose KernelManagers get its own factory whatever is installed."""
    own = KernelProvisionerFactory()
    monkeypatch.setattr(KernelProvisionerFactory, "instance", classmethod(lambda cls, **kw: own))


@pytest.fixture(params=[_no_private_hook, _own_singleton_only],
                ids=["private-method-gone", "factory-override-ignored"])
def changed_jupyter_client(request, slice_env, jp_data_dir, monkeypatch):
    """The hub's slice (1 GiB) and server environment, a kernelspec naming
    ``local-provisioner``, and a jupyter_client changed as the case says;
    jupyter_client's factory is cleared after."""
    hub = slice_env.root / "alice.slice"
    held = resolve_limits({"memory_limit": "1g"}, {}).limits
    slice_env.root.mkdir(mode=0o755, parents=True)
    create_limits_file(hub, held)  # as the hub makes them
    create_slice(hub, "alice", held)
    monkeypatch.setenv("HAMI_HUB_SLICE", str(hub))
    monkeypatch.setenv("HAMI_SLICE", str(hub))
    local = jp_data_dir / "kernels" / "local"
    local.mkdir(parents=True)
    (local / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "local", "language": "python",
        "metadata": {"kernel_provisioner": {"provisioner_name": "local-provisioner"}}}))
    request.param(monkeypatch)
    yield hub
    KernelProvisionerFactory.clear_instance()


async def test_the_server_refuses_every_kernel_and_says_why(changed_jupyter_client, capfd,
                                                            jp_serverapp, jp_fetch):
    hub = changed_jupyter_client
    with pytest.raises(HTTPClientError) as refused:
        await jp_fetch("api", "kernels", method="POST", body=json.dumps({"name": "local"}))
    assert refused.value.code == 500
    message = json.loads(refused.value.response.body)["message"]
    assert message.startswith(f"hami-jupyter: JupyterHub gave this server the slice {hub}, but "
                              "jupyter_client ")
    assert ("so that no kernel runs outside that slice, this server starts no kernel. The "
            "administrator must install a jupyter_client hami-jupyter supports (") in message
    assert jp_serverapp.kernel_manager.list_kernel_ids() == []
    # The server's log (its console) said it when the extension loaded.
    logged = capfd.readouterr().err
    assert any(line.endswith(message) for line in logged.splitlines()), logged
