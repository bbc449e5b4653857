"""The neutral core for vLLM-shaped APIs, as plan_run/ is for FlashInfer-shaped ones.

A batch is described by metadata tensors (query_start_loc, seq_lens, a block table into a
pool of blocks, a slot mapping for the cache writer) and, optionally, a metadata call that
plans from them (vLLM's get_scheduler_metadata). batch.py builds that description from the
logical problem; mismatch.py makes the description and the tensors disagree in one field,
for the metadata families (harness/model/capabilities.py METADATA_FIELDS).
"""
