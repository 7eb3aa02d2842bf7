# Builds the C parts; each also builds on its own with `make -C shim` / `make -C spank`.
PREFIX ?= /opt/gpucr-hpc

.PHONY: all shim spank check install install-helper clean
all: shim spank

shim:
	$(MAKE) -C shim

spank:
	$(MAKE) -C spank

# What needs neither a GPU nor Slurm: the shim's C unit tests, whether the generated
# hook registry is current (skipped, with one line, without cuda.h), and its layers.
check:
	$(MAKE) -C shim check

# The site layout the test cluster uses too: $(PREFIX)/lib/gpucr/{libgpucr-cuda.so,spank_gpucr.so}.
install: all install-helper
	$(MAKE) -C shim install PREFIX=$(PREFIX)
	$(MAKE) -C spank install PREFIX=$(PREFIX)

# The root helper that lets ordinary users run CRIU on their own jobs (sudo rule, node key),
# and the door for Slurm operators: make install GPUCR_OPERATORS=%slurm-ops (a sudoers user list).
PYTHON ?= $(CURDIR)/.venv/bin/python
GPUCR_OPERATORS ?=
install-helper:
	PREFIX=$(PREFIX) GPUCR_OPERATORS='$(GPUCR_OPERATORS)' scripts/install-helper $(PYTHON)

clean:
	$(MAKE) -C shim clean
	$(MAKE) -C spank clean
