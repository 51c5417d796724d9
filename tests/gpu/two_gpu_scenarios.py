"""Two-GPU scenarios, each run as its own process under the preload library
by tests/gpu/test_two_gpus.py. Each prints its figures and, last,
``RESULT {json}``.

    python3 two_gpu_scenarios.py caps LIMIT0 LIMIT1
    python3 two_gpu_scenarios.py ddp STEPS        (RANK, WORLD_SIZE, MASTER_* from the env)
"""

import json
import os
import sys

MiB = 1 << 20
GiB = 1 << 30
CHUNK = 128 * MiB


def result(**fields):
    print("RESULT " + json.dumps(fields), flush=True)


def caps(limits):
    """Fill each visible GPU in turn to its cap; what torch saw on each."""
    import torch

    out = []
    for dev, limit in enumerate(limits):
        free, total = torch.cuda.mem_get_info(dev)
        held, reached = [], 0
        try:
            while reached < 2 * limit:
                held.append(torch.empty(CHUNK, dtype=torch.uint8, device=f"cuda:{dev}"))
                reached += CHUNK
        except torch.cuda.OutOfMemoryError as e:
            print(f"cuda:{dev}: out of memory after {reached / GiB:.2f} GiB: {str(e).splitlines()[0][:200]}",
                  flush=True)
        uuid = str(torch.cuda.get_device_properties(dev).uuid)
        out.append({"total": total, "free": free, "reached": reached, "uuid": uuid,
                    "oom": reached < 2 * limit})
        del held
        torch.cuda.empty_cache()
    result(devices=out)


def ddp(steps):
    """A small DDP training over NCCL, one process per GPU."""
    import datetime

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    rank = int(os.environ["RANK"])
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=60))
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(),
                                torch.nn.Linear(4096, 1024)).cuda(rank)
    ddp_model = DistributedDataParallel(model, device_ids=[rank])
    opt = torch.optim.SGD(ddp_model.parameters(), lr=1e-3)
    torch.manual_seed(1234 + rank)
    for _ in range(steps):
        x = torch.randn(256, 1024, device=f"cuda:{rank}")
        loss = ddp_model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    torch.cuda.synchronize()
    # DDP keeps the replicas equal: the parameters' sum agrees on both ranks.
    checksum = torch.stack([p.detach().double().sum() for p in model.parameters()]).sum()
    sums = [torch.zeros_like(checksum) for _ in range(dist.get_world_size())]
    dist.all_gather(sums, checksum)
    free, total = torch.cuda.mem_get_info(rank)
    result(rank=rank, loss=float(loss), sums=[float(s) for s in sums], total=total, free=free,
           uuid=str(torch.cuda.get_device_properties(rank).uuid))
    dist.destroy_process_group()


def main():
    name, args = sys.argv[1], sys.argv[2:]
    if name == "caps":
        caps([int(a) for a in args])
    elif name == "ddp":
        ddp(int(args[0]))
    else:
        raise SystemExit(f"unknown scenario {name}")


if __name__ == "__main__":
    main()
