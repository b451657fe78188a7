"""Admission control: an adaptive concurrency limit per tier, a deadline-aware priority queue, and
early shedding when a request would miss its tenant's TTFT SLO anyway."""
