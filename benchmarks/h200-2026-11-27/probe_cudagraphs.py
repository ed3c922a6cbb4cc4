"""PyTorch's step on one GPU is launch-bound (flat from batch 32 to 256): what removes the
launch overhead?  The book's ResNet-18, width 64, 28x28x1; one process per variant; 5 warm-up
steps, then 3 repeats of 20 steps, median; clock read after torch.cuda.synchronize()."""
import json, os, statistics, sys, time
sys.path.insert(0, os.getcwd())
from d2lmini.bench import resnet18_train_flops
W, STEPS, REPEATS, WARM = 64, 20, 3, 5


def run(name, batches, fused=False, compile_mode=None, bf16=False):
    import torch
    from d2lmini.torch import resnet18
    torch.backends.cudnn.benchmark = True
    dev = torch.device("cuda")
    torch.manual_seed(0)
    net = resnet18(width=W).to(dev).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(net.parameters(), lr=0.05, fused=fused or None)
    loss_fn = torch.nn.CrossEntropyLoss()
    model = torch.compile(net, mode=compile_mode) if compile_mode else net
    for B in batches:
        X = torch.randn(B, 1, 28, 28, device=dev).contiguous(memory_format=torch.channels_last)
        y = torch.randint(0, 10, (B,), device=dev)

        def step():
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
                loss = loss_fn(model(X), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            return loss.detach()
        t0 = time.perf_counter()
        for _ in range(WARM):
            step()
        torch.cuda.synchronize()
        warm_s = time.perf_counter() - t0
        times = []
        for _ in range(REPEATS):
            t = time.perf_counter()
            for _ in range(STEPS):
                step()
            torch.cuda.synchronize()
            times.append((time.perf_counter() - t) / STEPS * 1e3)
        ms = statistics.median(times)
        print(json.dumps(dict(fw="torch", variant=name, batch=B, ms=round(ms, 2),
                              reps=[round(x, 2) for x in times], warm_s=round(warm_s, 1),
                              tflops=round(resnet18_train_flops(B, W) / ms * 1e3 / 1e12, 1),
                              version=torch.__version__)), flush=True)


VARIANTS = {
    "eager cl+bench": dict(),
    "eager cl+bench fusedSGD": dict(fused=True),
    "compile reduce-overhead (CUDA graphs) cl+bench fusedSGD": dict(fused=True, compile_mode="reduce-overhead"),
    "compile reduce-overhead cl+bench fusedSGD bf16": dict(fused=True, compile_mode="reduce-overhead", bf16=True),
}
if __name__ == "__main__":
    if len(sys.argv) > 1:
        run(sys.argv[1], [256, 32], **VARIANTS[sys.argv[1]])
    else:
        import subprocess
        for v in VARIANTS:
            try:
                p = subprocess.run([sys.executable, __file__, v], capture_output=True, text=True, timeout=110)
                print(p.stdout, end="", flush=True)
                if p.returncode:
                    print(json.dumps(dict(variant=v, error=p.stderr.strip().splitlines()[-1:])), flush=True)
            except subprocess.TimeoutExpired as e:
                print(json.dumps(dict(variant=v, error="timeout 110 s",
                                      partial=(e.stdout or b"").decode() if isinstance(e.stdout, bytes) else e.stdout)), flush=True)
