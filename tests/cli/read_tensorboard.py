#!/usr/bin/env python3
"""Reads a TensorBoard log directory with TensorBoard's own reader (the PyPI `tensorboard`
package, no TensorFlow) and prints {"scalars": {tag: [[step, value], ...]},
"texts": {tag: [[step, text], ...]}, "histograms": {tag: [[step, [bucket counts]], ...]}} as
JSON, for tests/cli/run_test.cpp.

By default the reader is EventAccumulator; with --plugin it is plugin_event_accumulator's, which
TensorBoard's server uses without its Rust data server (--load_fast=false). They differ in what
a SessionLog START purges: EventAccumulator purges at every START but leaves text (tensor)
summaries alone; the plugin reader takes a run's first START as its beginning and purges at
later ones, text included."""
import json
import sys

from tensorboard.backend.event_processing import event_accumulator as ea
from tensorboard.backend.event_processing import plugin_event_accumulator as pea
from tensorboard.util import tensor_util


def read_legacy(path):
    acc = ea.EventAccumulator(path,
                              size_guidance={ea.SCALARS: 0, ea.TENSORS: 0, ea.HISTOGRAMS: 0})
    acc.Reload()
    tags = acc.Tags()
    return {
        "scalars": {t: [[e.step, e.value] for e in acc.Scalars(t)] for t in tags["scalars"]},
        "texts": {
            t: [[e.step, e.tensor_proto.string_val[0].decode("utf-8", "replace")]
                for e in acc.Tensors(t)]
            for t in tags["tensors"]
        },
        "histograms": {
            t: [[e.step, list(e.histogram_value.bucket)] for e in acc.Histograms(t)]
            for t in tags["histograms"]
        },
    }


def read_plugin(path):
    acc = pea.EventAccumulator(path, size_guidance={pea.TENSORS: 0})
    acc.Reload()
    out = {"scalars": {}, "texts": {}, "histograms": {}}
    for tag in acc.Tags()[pea.TENSORS]:
        plugin = acc.SummaryMetadata(tag).plugin_data.plugin_name
        if plugin == "histograms":  # [buckets, 3]: left edge, right edge, count
            out["histograms"][tag] = [
                [e.step, [float(row[2]) for row in tensor_util.make_ndarray(e.tensor_proto)]]
                for e in acc.Tensors(tag)]
            continue
        points = [[e.step, tensor_util.make_ndarray(e.tensor_proto).item()]
                  for e in acc.Tensors(tag)]
        if plugin == "text":
            out["texts"][tag] = [[s, v.decode("utf-8", "replace")] for s, v in points]
        else:
            out["scalars"][tag] = [[s, float(v)] for s, v in points]
    return out


path = sys.argv[1]
json.dump(read_plugin(path) if "--plugin" in sys.argv[2:] else read_legacy(path), sys.stdout)
