"""Two ranks (two "hosts") probe each other, one way after the other and then both ways at once,
through the health check's own probe rounds; rank 0 prints the rows as JSON."""

import json
import sys

import torch
import torch.distributed as dist

from dpro.anomaly.health.backend_pairwise import _probe_rounds

dist.init_process_group("gloo")
rows = {}
for both_ways in (False, True):
    found = _probe_rounds([0, 1], [[(0, 1)], [(0, 1)]], 0, 2**16, 0.05, torch.device("cpu"), None, [], both_ways)
    rows["both" if both_ways else "one"] = found.tolist()
if dist.get_rank() == 0:
    json.dump(rows, sys.stdout)
dist.destroy_process_group()
