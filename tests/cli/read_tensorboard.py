#!/usr/bin/env python3
"""Reads a TensorBoard log directory with TensorBoard's own EventAccumulator (the PyPI
`tensorboard` package, no TensorFlow) and prints {"scalars": {tag: [[step, value], ...]},
"texts": {tag: [[step, text], ...]}} as JSON, for tests/cli/run_test.cpp."""
import json
import sys

from tensorboard.backend.event_processing import event_accumulator as ea

acc = ea.EventAccumulator(sys.argv[1], size_guidance={ea.SCALARS: 0, ea.TENSORS: 0})
acc.Reload()
tags = acc.Tags()
out = {
    "scalars": {t: [[e.step, e.value] for e in acc.Scalars(t)] for t in tags["scalars"]},
    "texts": {
        t: [[e.step, e.tensor_proto.string_val[0].decode("utf-8", "replace")]
            for e in acc.Tensors(t)]
        for t in tags["tensors"]
    },
}
json.dump(out, sys.stdout)
