"""Runs datatrove's MinHash dedup (signature, buckets, cluster, filter) on a JSONL dir; prints JSON stats.

Executed with datatrove's own venv (benchmarks/.venvs/datatrove) by benchmarks/dedup.py.
`python _dedup_datatrove.py JSONL_DIR WORK_DIR WORKERS`
"""

import json
import resource
import sys
import time

from datatrove.executor import LocalPipelineExecutor
from datatrove.pipeline.dedup.minhash import (
    MinhashConfig,
    MinhashDedupBuckets,
    MinhashDedupCluster,
    MinhashDedupFilter,
    MinhashDedupSignature,
)
from datatrove.pipeline.readers import JsonlReader
from datatrove.pipeline.writers.jsonl import JsonlWriter
from datatrove.utils.hashing import HashConfig

src, work, workers = sys.argv[1], sys.argv[2], int(sys.argv[3])
# 14 buckets x 8 hashes (datatrove default), 5-gram shingles, 64-bit sha1 (the xxhash wheel on the offline index predates str input).
cfg = MinhashConfig(hash_config=HashConfig(precision=64, hash_fc="sha1"), num_buckets=14, hashes_per_bucket=8)
start = time.perf_counter()
common = dict(skip_completed=False)
# Each stage logs under the work dir (datatrove's default is ./logs, wherever it is started from).
LocalPipelineExecutor([JsonlReader(src), MinhashDedupSignature(output_folder=f"{work}/sigs", config=cfg)],
                      tasks=workers, workers=workers, logging_dir=f"{work}/logs/sigs", **common).run()
LocalPipelineExecutor([MinhashDedupBuckets(input_folder=f"{work}/sigs", output_folder=f"{work}/buckets", config=cfg)],
                      tasks=cfg.num_buckets, workers=workers, logging_dir=f"{work}/logs/buckets", **common).run()
LocalPipelineExecutor([MinhashDedupCluster(input_folder=f"{work}/buckets", output_folder=f"{work}/remove_ids",
                                           config=cfg, save_cluster_id=True)], tasks=1,
                      logging_dir=f"{work}/logs/cluster", **common).run()
LocalPipelineExecutor([JsonlReader(src), MinhashDedupFilter(input_folder=f"{work}/remove_ids",
                                                            exclusion_writer=JsonlWriter(f"{work}/removed")),
                       JsonlWriter(f"{work}/kept")], tasks=workers, workers=workers, logging_dir=f"{work}/logs/filter",
                      **common).run()
seconds = time.perf_counter() - start
peak = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
print(json.dumps({"seconds": seconds, "peak_rss_mb": peak / 1024}))
