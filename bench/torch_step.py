"""End-to-end cost of the preload library on a PyTorch training step.

Run as `python bench/torch_step.py` inside and outside the preload
(bench/run_torch_step.sh does both, alternating). Prints one JSON line with
the median step time over several timed windows.
"""
import json
import statistics
import time

import torch


def main(steps=60, windows=7):
    torch.manual_seed(0)
    dev = torch.device("cuda")
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 64, 3, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(64, 128, 3, padding=1), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(8), torch.nn.Flatten(),
        torch.nn.Linear(128 * 64, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10),
    ).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(128, 3, 64, 64, device=dev)
    y = torch.randint(0, 10, (128,), device=dev)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()

    for _ in range(20):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(windows):
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) / steps * 1e3)
    free, total = torch.cuda.mem_get_info()
    print(json.dumps({"step_ms": statistics.median(times), "windows_ms": times, "mem_total": total}))


if __name__ == "__main__":
    main()
