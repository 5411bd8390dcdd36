#!/usr/bin/env python3
"""Writes the 16 homelab and small-lab GPU traces of this folder next to
itself: shapes written apart from the tuner's trace generator
(internal/tuner/sim/generate_test.go), with a fixed seed, so that the
traces come out the same on every run. python3 gen.py rewrites them."""
import random, os

OUT = os.path.dirname(os.path.abspath(__file__))
GiB = 1 << 30
MiB = 1 << 20
H = 3600
M = 60
rng = random.Random(20241128)
SUF = "bcdfghjklmnpqrstvwxz2456789"


def g(x):  # GiB float -> int bytes, rounded to MiB
    return int(round(x * 1024)) * MiB


def dur(s):
    s = int(round(s))
    if s == 0:
        return "0s"
    h, r = divmod(s, 3600)
    m, sec = divmod(r, 60)
    out = ""
    if h:
        out += f"{h}h"
    if m:
        out += f"{m}m"
    if sec:
        out += f"{sec}s"
    return out


def suffix(n=5):
    return "".join(rng.choice(SUF) for _ in range(n))


def rshash():
    return "".join(rng.choice(SUF) for _ in range(rng.choice([9, 10])))


class Trace:
    def __init__(self, name, comment, gib, init, hours, keyed):
        self.name, self.comment, self.gib, self.init = name, comment, gib, init
        self.dur = int(hours * H)
        self.keyed = keyed
        self.pods = []
        self.names = set()

    def add(self, name, workload, arrive, run, mem):
        assert name not in self.names, name
        assert 0 <= arrive < self.dur, (name, arrive)
        self.names.add(name)
        # merge / clean memory steps
        clean = []
        for t, b in mem:
            t = int(round(t))
            if clean and t <= clean[-1][0]:
                raise ValueError((name, mem))
            if clean and clean[-1][1] == b:
                continue
            clean.append((t, b))
        assert clean[0][0] == 0
        self.pods.append((name, workload if self.keyed else None, int(arrive), max(1, int(run)), clean))

    def write(self):
        path = os.path.join(OUT, self.name + ".yaml")
        self.pods.sort(key=lambda p: p[2])
        with open(path, "w") as f:
            for line in self.comment.strip().splitlines():
                f.write("# " + line.strip() + "\n")
            f.write(f"gpu: {{memoryTotalBytes: {self.gib * GiB}}}\n")
            f.write(f"initialReplicas: {self.init}\n")
            f.write(f"duration: {dur(self.dur)}\n")
            f.write("pods:\n")
            for name, wl, arr, run, mem in self.pods:
                f.write(f"  - name: {name}\n")
                if wl:
                    f.write(f"    workload: {wl}\n")
                f.write(f"    arrive: {dur(arr)}\n")
                f.write(f"    run: {dur(run)}\n")
                ms = ", ".join(f"[{dur(t)}, {b}]" for t, b in mem)
                f.write(f"    memory: [{ms}]\n")
        print(f"{self.name}: {len(self.pods)} pods")


def service(tr, name, wl, base, load_at=60, arrive=0, run=None, extra=()):
    """A Deployment pod running the whole trace: small at start, base after load."""
    run = run or tr.dur
    mem = [(0, g(min(0.4, base)))] + [(load_at, g(base))] + list(extra)
    tr.add(name, wl, arrive, run, mem)


# ---------------------------------------------------------------- 1
def comfyui_24g():
    tr = Trace("comfyui-24g-spikes", """
A 24 GiB card at home: a ComfyUI deployment idles at 3.5 GiB and spikes to
10-14 GiB during evening generation sessions (SDXL + refiner), beside Frigate
(1.5 GiB) and Immich ML (2.5 GiB), plus a few LoRA-training Jobs (7-9 GiB).
""", 24, 2, 24, keyed=True)
    sessions = []
    t = 8 * H
    while t < 23.5 * H:
        if 17 * H < t < 23 * H or rng.random() < 0.3:
            length = rng.randint(2, 25) * M
            sessions.append((t, length, rng.choice([10, 11.5, 12.5, 14])))
            t += length + rng.randint(5, 40) * M
        else:
            t += rng.randint(40, 120) * M
    mem = [(0, g(0.5)), (90, g(3.5))]
    for at, length, peak in sessions:
        mem += [(at, g(peak)), (at + length, g(3.5))]
    tr.add(f"comfyui-{rshash()}-{suffix()}", "comfyui", 0, tr.dur, mem)
    service(tr, f"frigate-{rshash()}-{suffix()}", "frigate", 1.5, 45)
    service(tr, f"immich-machine-learning-{rshash()}-{suffix()}", "immich-ml", 2.5, 120)
    for i, at in enumerate([10.5 * H, 14 * H, 20 * H, 22.2 * H]):
        tr.add(f"lora-train-{i+1}-{suffix()}", "lora-train", at, rng.randint(35, 80) * M,
               [(0, g(2)), (3 * M, g(rng.choice([7, 8, 9])))])
    tr.write()


# ---------------------------------------------------------------- 2
def sdwebui_12g():
    tr = Trace("sdwebui-12g-spikes", """
A 12 GiB card (RTX 3060): AUTOMATIC1111 web UI at 2.8 GiB that spikes to
8-9.5 GiB while generating (hires fix), a Jellyfin server (0.4 GiB), and
upscale batch pods (3-4 GiB, ESRGAN) from a folder watcher every few hours.
Pods keyed by name.
""", 12, 1, 36, keyed=False)
    mem = [(0, g(0.3)), (2 * M, g(2.8))]
    t = 1 * H
    while t < tr.dur - H:
        length = rng.randint(3, 20) * M
        mem += [(t, g(rng.choice([8, 8.5, 9.5]))), (t + length, g(2.8))]
        t += length + rng.randint(20, 240) * M
    tr.add("sd-webui-0", None, 0, tr.dur, mem)
    service(tr, "jellyfin-0", None, 0.4, 30)
    n = 0
    t = 2 * H
    while t < tr.dur - H:
        for _ in range(rng.randint(1, 4)):
            n += 1
            tr.add(f"esrgan-upscale-{n}", None, t + rng.randint(0, 120), rng.randint(4, 18) * M,
                   [(0, g(1)), (40, g(rng.choice([3, 3.5, 4])))])
        t += rng.randint(2, 5) * H
    tr.write()


# ---------------------------------------------------------------- 3
def ollama_16g():
    tr = Trace("ollama-16g-swap", """
A 16 GiB card: an Ollama server that loads models on demand (llama3-8B q4
5 GiB, mistral 4.5 GiB, 13B q4 9 GiB, codellama-13B 8.5 GiB) and unloads
them after keep_alive (5 min) idle; an Immich ML pod (2 GiB); and nightly
Open-WebUI embedding re-index Jobs (1.5 GiB), and Paperless OCR jobs
(2.5 GiB) at any hour. Not keyed.
""", 16, 1, 36, keyed=False)
    mem = [(0, g(0.4))]
    t = 7 * H
    models = [5, 4.5, 9, 8.5]
    while t < tr.dur - 30 * M:
        hour = (t // H) % 24
        if 7 <= hour <= 23:
            size = rng.choice(models)
            use = rng.randint(2, 45) * M
            mem += [(t, g(0.4 + size)), (t + use + 5 * M, g(0.4))]
            t += use + 5 * M + rng.randint(5, 90) * M
        else:
            t += H
    tr.add(f"ollama-{rshash()}-{suffix()}", None, 0, tr.dur, mem)
    service(tr, f"immich-ml-{rshash()}-{suffix()}", None, 2, 90)
    for day in range(2):
        at = day * 24 * H + 3 * H
        if at < tr.dur:
            tr.add(f"webui-reindex-{28900000 + day * 1440 + 180}-{suffix()}", None, at,
                   rng.randint(20, 40) * M, [(0, g(0.5)), (30, g(1.5))])
    for i in range(18):
        at = rng.randint(8 * H, tr.dur - H)
        tr.add(f"paperless-ocr-{i+1}", None, at, rng.randint(5, 30) * M, [(0, g(0.6)), (20, g(2.5))])
    tr.write()


# ---------------------------------------------------------------- 4
def ollama_48g():
    tr = Trace("ollama-48g-70b", """
A 48 GiB card (A6000) in a small lab: two Ollama instances; one serves a 70B
q4 model (40 GiB) a few times a day and sits at 0.5 GiB otherwise, the other
keeps 8B/14B models (5-10 GiB) loaded for the team; plus a code-embedding
service (3 GiB) and ad-hoc eval Jobs (6 GiB) during the day. Keyed.
""", 48, 6, 24, keyed=True)
    mem = [(0, g(0.5))]
    for at in [9.5 * H, 13 * H, 16.2 * H, 20 * H]:
        mem += [(at, g(40.5)), (at + rng.randint(30, 90) * M, g(0.5))]
    tr.add(f"ollama-big-{rshash()}-{suffix()}", "ollama-big", 0, tr.dur, mem)
    mem = [(0, g(0.5))]
    t = 8 * H
    while t < 22 * H:
        size = rng.choice([5.5, 9.5, 10])
        use = rng.randint(10, 60) * M
        mem += [(t, g(size)), (t + use, g(0.5))]
        t += use + rng.randint(5, 30) * M
    tr.add(f"ollama-small-{rshash()}-{suffix()}", "ollama-small", 0, tr.dur, mem)
    service(tr, f"code-embed-{rshash()}-{suffix()}", "code-embed", 3, 60)
    for i in range(10):
        at = rng.randint(9 * H, 19 * H)
        tr.add(f"eval-harness-{i+1}-{suffix()}", "eval-harness", at, rng.randint(15, 50) * M,
               [(0, g(1)), (2 * M, g(6))])
    tr.write()


# ---------------------------------------------------------------- 5
def jupyter_48g():
    tr = Trace("jupyter-48g-team", """
A 48 GiB card shared by a team of 7: JupyterHub notebook pods arrive 9-11am,
start at 0.3 GiB and load a model (4-12 GiB) 3-15 minutes in; some notebooks
sit idle (memory held) for hours until culled at 6-9h; two students load a
second bigger model after lunch. Each notebook is its own workload (first seen).
""", 48, 4, 12, keyed=False)
    users = ["alice", "bob", "chen", "dara", "emeka", "farah", "goran"]
    for u in users:
        at = rng.randint(9 * H, 11 * H) - 8 * H  # trace starts 8am
        load = rng.randint(3, 15) * M
        size = rng.choice([4, 5.5, 7, 8, 10, 12])
        mem = [(0, g(0.3)), (load, g(size))]
        if u in ("chen", "farah"):
            mem.append((5 * H - at, g(size + rng.choice([4, 6]))))
        tr.add(f"jupyter-{u}", None, at, rng.randint(6, 9) * H, mem)
    # a couple of short sessions restarted later by the same users (numbered runs)
    for i, u in enumerate(["bob", "dara"]):
        at = rng.randint(5 * H, 7 * H)
        tr.add(f"jupyter-{u}-2", None, at, 2 * H, [(0, g(0.3)), (6 * M, g(6))])
    tr.write()


# ---------------------------------------------------------------- 6
def nightly_24g():
    tr = Trace("nightly-train-24g-grow", """
A 24 GiB card over three days: a nightly fine-tuning CronJob at 01:00 whose
memory grows (4 -> 9 -> 15 GiB as batch/seq-len warm up, 17 GiB on eval)
and runs ~4h; daytime Frigate (1.2 GiB) and Immich (2 GiB), and a handful of
daytime inference pods (2-3 GiB). Not keyed.
""", 24, 3, 72, keyed=False)
    service(tr, f"frigate-{rshash()}-{suffix()}", None, 1.2, 30)
    service(tr, f"immich-ml-{rshash()}-{suffix()}", None, 2, 90)
    for day in range(3):
        at = day * 24 * H + 1 * H
        run = rng.randint(210, 280) * M
        grow = 1 + day * 0.5  # the dataset grows every night
        mem = [(0, g(4)), (5 * M, g(9)), (20 * M, g(min(15, 12 + grow))), (run - 25 * M, g(17))]
        tr.add(f"finetune-nightly-{29000000 + day * 1440 + 60}-{suffix()}", None, at, run, mem)
        for k in range(rng.randint(4, 7)):
            a = day * 24 * H + rng.randint(9 * H, 21 * H)
            tr.add(f"caption-infer-{suffix()}", None, a, rng.randint(10, 60) * M,
                   [(0, g(0.8)), (45, g(rng.choice([2, 2.5, 3])))])
    tr.write()


# ---------------------------------------------------------------- 7
def frigate_12g():
    tr = Trace("frigate-immich-12g-steady", """
A 12 GiB card in a NAS: Frigate with TensorRT detectors (two cameras' pods,
0.9 GiB each), Immich ML (2.2 GiB, 3 GiB while the nightly face-clustering
runs), a Home-Assistant Whisper add-on (1.1 GiB), and short CLIP re-index
Jobs (1.5 GiB) after photo uploads. Small and steady. Keyed.
""", 12, 3, 48, keyed=True)
    service(tr, "frigate-det-0", "frigate-det", 0.9, 40)
    service(tr, "frigate-det-1", "frigate-det", 0.9, 40)
    mem = [(0, g(0.3)), (2 * M, g(2.2))]
    for day in range(2):
        mem += [(day * 24 * H + 2 * H, g(3)), (day * 24 * H + 3 * H, g(2.2))]
    tr.add(f"immich-ml-{rshash()}-{suffix()}", "immich-ml", 0, tr.dur, mem)
    service(tr, f"wyoming-whisper-{rshash()}-{suffix()}", "wyoming-whisper", 1.1, 60)
    for i in range(14):
        at = rng.randint(1 * H, tr.dur - H)
        tr.add(f"immich-clip-reindex-{i+1}", "clip-reindex", at, rng.randint(3, 25) * M,
               [(0, g(0.5)), (20, g(1.5))])
    tr.write()


# ---------------------------------------------------------------- 8
def whisper_16g():
    tr = Trace("whisper-16g-queue", """
A 16 GiB card draining a transcription queue: ~300 Whisper (medium, fp16)
jobs, 0.8 GiB while loading and 3.2-3.6 GiB from 25 s, 2-15 min each;
arrivals are bursty (podcast feeds refresh hourly, a batch upload at 14:00).
Not keyed: the jobs are numbered runs of one script.
""", 16, 2, 24, keyed=False)
    n = 0
    arrivals = []
    for hr in range(24):
        base = hr * H
        k = rng.randint(4, 9) if 7 <= hr <= 23 else rng.randint(0, 3)
        for _ in range(k):
            arrivals.append(base + rng.randint(0, 10 * M))
    for _ in range(80):
        arrivals.append(14 * H + rng.randint(0, 20 * M))
    for at in sorted(arrivals):
        n += 1
        tr.add(f"whisper-transcribe-{n}", None, at, rng.randint(2, 15) * M,
               [(0, g(0.8)), (25, g(rng.choice([3.2, 3.4, 3.6])))])
    tr.write()


# ---------------------------------------------------------------- 9
def ci_24g():
    tr = Trace("ci-24g-push-bursts", """
A 24 GiB card behind a self-hosted CI runner for two days: each push starts
3-6 GPU test pods within a minute (unit 1-2 GiB, model tests 4-5 GiB, one
integration test at 9 GiB 1 min in), 2-12 min each; pushes come at
irregular times, mostly working hours, a few at night. Keyed by job kind.
""", 24, 2, 48, keyed=True)
    pushes = []
    for day in range(2):
        t = day * 24 * H + 8 * H
        while t < day * 24 * H + 20 * H:
            pushes.append(t)
            t += int(rng.expovariate(1 / (50 * M)))
        for _ in range(2):
            pushes.append(day * 24 * H + rng.randint(21 * H, 23 * H))
    for p in sorted(pushes):
        if p >= tr.dur - 20 * M:
            continue
        kinds = ["unit", "unit", "model", "model", "integration", "model"][: rng.randint(3, 6)]
        for kind in kinds:
            at = p + rng.randint(5, 60)
            if kind == "unit":
                mem, run = [(0, g(rng.choice([1, 1.5, 2])))], rng.randint(2, 5) * M
            elif kind == "model":
                mem, run = [(0, g(1)), (30, g(rng.choice([4, 4.5, 5])))], rng.randint(4, 10) * M
            else:
                mem, run = [(0, g(2)), (60, g(9))], rng.randint(8, 12) * M
            tr.add(f"ci-gpu-{kind}-{suffix()}", f"ci-gpu-{kind}", at, run, mem)
    tr.write()


# ---------------------------------------------------------------- 10
def vllm_48g():
    tr = Trace("vllm-48g-reserved", """
A 48 GiB card: a vLLM server with --gpu-memory-utilization 0.9 (43.2 GiB
after a 2-minute load at 3 GiB), beside small jobs: a reranker (1.2 GiB)
all day, and short embedding/OCR jobs (0.6-1.5 GiB) through the day, and
two 3.5 GiB layout-parser jobs that only fit when little else runs. Not keyed.
""", 48, 2, 24, keyed=False)
    tr.add(f"vllm-qwen2-7b-{rshash()}-{suffix()}", None, 0, tr.dur,
           [(0, g(3)), (2 * M, int(0.9 * 48 * GiB))])
    service(tr, f"bge-reranker-{rshash()}-{suffix()}", None, 1.2, 90, arrive=5 * M)
    n = 0
    t = 30 * M
    while t < tr.dur - 30 * M:
        n += 1
        tr.add(f"embed-docs-{n}", None, t, rng.randint(3, 20) * M,
               [(0, g(0.4)), (20, g(rng.choice([0.6, 0.8, 1.0])))])
        if rng.random() < 0.3:
            tr.add(f"ocr-pages-{n}", None, t + 60, rng.randint(5, 15) * M,
                   [(0, g(0.5)), (30, g(1.5))])
        t += rng.randint(10, 50) * M
    for i, at in enumerate([6 * H, 15 * H]):
        tr.add(f"layout-parser-{i+1}", None, at, 40 * M, [(0, g(1)), (1 * M, g(3.5))])
    tr.write()


# ---------------------------------------------------------------- 11
def katib_80g():
    tr = Trace("katib-80g-sweep", """
An 80 GiB card (A100): a Kubeflow Katib sweep of 32 trials of one training
script created at 02:00 with parallelism unlimited; a trial is 2 GiB while
loading data and 8-16 GiB (batch size varies 2x) from 2-4 min in, 25-70 min
each; a 20 GiB notebook server runs all day. Trials share one name stem.
""", 80, 4, 24, keyed=False)
    service(tr, "jupyter-lab-0", None, 20, 10 * M)
    for i in range(32):
        bs = rng.choice([8, 10, 12, 14, 16])
        tr.add(f"resnet-sweep-{suffix()}", None, 2 * H + rng.randint(0, 90), rng.randint(25, 70) * M,
               [(0, g(2)), (rng.randint(2, 4) * M, g(bs))])
    # a second, smaller sweep in the afternoon
    for i in range(20):
        bs = rng.choice([5, 6, 8, 10])
        tr.add(f"bert-sweep-{suffix()}", None, 14 * H + rng.randint(0, 600), rng.randint(15, 40) * M,
               [(0, g(1.5)), (90, g(bs))])
    tr.write()


# ---------------------------------------------------------------- 12
def jellyfin_12g():
    tr = Trace("jellyfin-12g-nvenc", """
A 12 GiB card in a media server: Tdarr/Jellyfin NVENC transcode pods, each
250-450 MiB, 10-50 min, many at once in the evening (up to ~8) and a few
through the night for the library re-encode; a tiny Frigate detector (0.7 GiB).
Keyed.
""", 12, 2, 48, keyed=True)
    service(tr, "frigate-0", "frigate", 0.7, 30)
    n = 0
    for day in range(2):
        for hr in range(24):
            k = {18: 5, 19: 8, 20: 9, 21: 7, 22: 4}.get(hr, rng.randint(0, 2))
            for _ in range(k):
                n += 1
                at = day * 24 * H + hr * H + rng.randint(0, H - 1)
                if at >= tr.dur:
                    continue
                tr.add(f"transcode-{n}", "nvenc-transcode", at, rng.randint(10, 50) * M,
                       [(0, g(0.15)), (5, rng.randint(250, 450) * MiB)])
    tr.write()


# ---------------------------------------------------------------- 13
def week_16g():
    tr = Trace("week-16g-mix", """
A 16 GiB card over three days (a week's mix, compressed): Immich (2 GiB)
always; Ollama (0.4 GiB, 5-9 GiB when a model is loaded) in the evenings;
a Whisper queue by day (3 GiB jobs); nightly LoRA training (6 -> 10 GiB);
ComfyUI sessions as short-lived pods (4 GiB, 9 GiB while generating). Not keyed.
""", 16, 3, 72, keyed=False)
    service(tr, f"immich-ml-{rshash()}-{suffix()}", None, 2, 90)
    mem = [(0, g(0.4))]
    for day in range(3):
        t = day * 24 * H + 18 * H
        while t < day * 24 * H + 23 * H:
            use = rng.randint(5, 50) * M
            mem += [(t, g(rng.choice([5, 5.4, 9]))), (t + use, g(0.4))]
            t += use + rng.randint(10, 60) * M
    tr.add(f"ollama-{rshash()}-{suffix()}", None, 0, tr.dur, mem)
    w = 0
    c = 0
    for day in range(3):
        for _ in range(rng.randint(40, 60)):
            w += 1
            tr.add(f"whisper-job-{w}", None, day * 24 * H + rng.randint(8 * H, 18 * H), rng.randint(3, 12) * M,
                   [(0, g(0.7)), (20, g(3))])
        at = day * 24 * H + 2 * H
        tr.add(f"lora-nightly-{29100000 + day * 1440 + 120}-{suffix()}", None, at, rng.randint(90, 150) * M,
               [(0, g(6)), (10 * M, g(10))])
        for _ in range(rng.randint(3, 6)):
            c += 1
            at = day * 24 * H + rng.randint(10 * H, 22 * H)
            run = rng.randint(20, 90) * M
            mem = [(0, g(0.5)), (60, g(4))]
            t = 5 * M
            while t < run - 5 * M:
                mem += [(t, g(9)), (t + 2 * M, g(4))]
                t += rng.randint(5, 15) * M
            tr.add(f"comfyui-session-{c}", None, at, run, mem)
    tr.write()


# ---------------------------------------------------------------- 14
def nofit_24g():
    tr = Trace("nofit-24g-finetune", """
A 24 GiB card with services using 19.5 GiB (Ollama 9, ComfyUI 6, Immich 2.5,
Frigate 2); at 03:00 a QLoRA fine-tune that needs 8 GiB arrives (free: 4.5),
and twice more later; meanwhile small 1 GiB thumbnail jobs keep coming.
The fine-tune cannot run beside the services at any count. Keyed.
""", 24, 3, 24, keyed=True)
    service(tr, "ollama-0", "ollama", 9, 2 * M)
    service(tr, "comfyui-0", "comfyui", 6, 90)
    service(tr, "immich-ml-0", "immich-ml", 2.5, 90)
    service(tr, "frigate-0", "frigate", 2, 30)
    for i, at in enumerate([3 * H, 9 * H, 16 * H]):
        tr.add(f"qlora-finetune-{i+1}", "qlora-finetune", at, 2 * H, [(0, g(1)), (90, g(8))])
    for i in range(40):
        at = rng.randint(30 * M, tr.dur - 30 * M)
        tr.add(f"thumbs-{i+1}", "thumbs", at, rng.randint(2, 10) * M, [(0, g(0.3)), (10, g(1))])
    tr.write()


# ---------------------------------------------------------------- 15
def late_48g():
    tr = Trace("late-step-48g", """
A 48 GiB card: a 16 GiB model server all day, then a queue of document-QA
batch jobs from 08:00, each 1.5 GiB for its first 20 min (parsing on CPU)
and then 13-15 GiB (loads a 7B model) for 15-30 min more; a few 2 GiB
cron jobs in between. Keyed.
""", 48, 3, 20, keyed=True)
    service(tr, f"tgi-server-{rshash()}-{suffix()}", "tgi", 16, 3 * M)
    t = 8 * H
    n = 0
    while t < 18 * H:
        n += 1
        run = 20 * M + rng.randint(15, 30) * M
        tr.add(f"docqa-batch-{n}-{suffix()}", "docqa-batch", t, run,
               [(0, g(1.5)), (20 * M, g(rng.choice([13, 14, 15])))])
        t += rng.randint(2, 25) * M
    for i in range(12):
        at = rng.randint(1 * H, 19 * H)
        tr.add(f"metrics-export-{29200000 + i * 97}-{suffix()}", "metrics-export", at, rng.randint(3, 8) * M,
               [(0, g(2))])
    tr.write()


# ---------------------------------------------------------------- 16
def whisper_12g():
    tr = Trace("whisper-12g-mixed", """
A 12 GiB card, one replica to start: a voice-notes pipeline runs Whisper
small (1.9-2.2 GiB) jobs all day from a queue, and a meeting recorder sends
large-v3 jobs (6 GiB after 40 s) a few times a day; a Piper TTS service sits
at 0.6 GiB. Not keyed: both are numbered runs of their own name.
""", 12, 1, 30, keyed=False)
    service(tr, "piper-tts-0", None, 0.6, 20)
    n = 0
    t = 10 * M
    while t < tr.dur - 10 * M:
        n += 1
        tr.add(f"whisper-small-{n}", None, t, rng.randint(1, 6) * M,
               [(0, g(0.5)), (15, g(rng.choice([1.9, 2.0, 2.2])))])
        hr = (t // H) % 24
        t += rng.randint(1, 8) * M if 8 <= hr <= 22 else rng.randint(15, 60) * M
    for k in range(8):
        at = rng.randint(9 * H, 29 * H)
        tr.add(f"whisper-large-{k+1}", None, at, rng.randint(15, 50) * M,
               [(0, g(1)), (40, g(6))])
    tr.write()


for fn in [comfyui_24g, sdwebui_12g, ollama_16g, ollama_48g, jupyter_48g, nightly_24g,
           frigate_12g, whisper_16g, ci_24g, vllm_48g, katib_80g, jellyfin_12g, week_16g,
           nofit_24g, late_48g, whisper_12g]:
    fn()
