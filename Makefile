# Builds the C parts; each also builds on its own with `make -C shim` / `make -C spank`.
PREFIX ?= /opt/gpucr-hpc

.PHONY: all shim spank install clean
all: shim spank

shim:
	$(MAKE) -C shim

spank:
	$(MAKE) -C spank

# The site layout the test cluster uses too: $(PREFIX)/lib/gpucr/{libgpucr-cuda.so,spank_gpucr.so}.
install: all
	$(MAKE) -C shim install PREFIX=$(PREFIX)
	$(MAKE) -C spank install PREFIX=$(PREFIX)

clean:
	$(MAKE) -C shim clean
	$(MAKE) -C spank clean
