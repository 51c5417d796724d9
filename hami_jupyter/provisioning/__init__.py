"""Starting notebook kernels inside their slices.

- :mod:`.provisioner`: ``HamiProvisioner``, the jupyter_client kernel
  provisioner registered as ``hami-provisioner``;
- :mod:`.hub_slice`: under JupyterHub, the hub's slice and what a kernel may
  ask of it;
- :mod:`.factory`: under JupyterHub, every kernelspec starts through
  ``hami-provisioner``;
- :mod:`.kernelspec`: kernelspecs of set slice sizes (``hami-jupyter kernelspec``).

Nothing here imports IPython: this package runs in the Jupyter server process.
"""
