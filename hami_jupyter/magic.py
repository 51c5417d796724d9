"""``%hami``: the slice of this kernel, from inside the kernel (in progress)."""


def load_ipython_extension(ipython):
    pass
