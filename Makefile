# One command each for the main job and the tests; both set up .venv on first use.
PY := .venv/bin/python
export TRITON_INTERPRET ?= 1

.PHONY: run test lint bench bench-beyond setup clean

.venv/.installed: pyproject.toml scripts/setup.sh
	bash scripts/setup.sh

setup: .venv/.installed

# The main job: compile the causal attention example, show the plan and verify it against float64
# (on a CPU the kernels run through Triton's interpreter).
run: .venv/.installed
	.venv/bin/neptune-eq compile examples/causal_attention.py

# two worker processes, each taking whole files (a file's tests share their compiles): the suite's
# compiles are single-threaded Python, so the 2-core CI machine halves its time (14.2–14.5 min cold on 2026-12-06, session 59's machine; CI: 19.9 min on session 58's commit)
test: .venv/.installed
	$(PY) -m pytest -q -x --durations=15 -n 2 --dist loadfile

lint: .venv/.installed
	.venv/bin/ruff check .

# GPU only: the comparison against SDPA / FlexAttention / torch.compile (see bench/README.md)
bench: .venv/.installed
	TRITON_INTERPRET=0 $(PY) bench/run.py

# GPU only: softmax family, norms feeding a matmul, linear cross-entropy, biased / causal / GQA
# attention beside eager, torch.compile, SDPA / FlexAttention, Liger-Kernel (see bench/beyond/README.md)
bench-beyond: .venv/.installed
	TRITON_INTERPRET=0 $(PY) bench/beyond/run.py

clean:
	rm -rf .venv .pytest_cache .ruff_cache
