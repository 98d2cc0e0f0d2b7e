"""How a worker's batches cross to the consumer's process.

``pipe.py`` frames a batch (its pickle, its buffers in band, through the pipe, as
descriptors or in a slot) and reads it back; ``slabs.py`` holds the shared-memory slots a
worker reuses and the consumer's leases of them; ``mapping.py`` maps a descriptor's file
without keeping the descriptor.
"""
