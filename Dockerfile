# syntax=docker/dockerfile:1
# The gyre command in a small image: docker build -t gyre .
#
# Built with cgo on a glibc base, so that the NVML GPU probe can load
# libnvidia-ml when the NVIDIA container runtime mounts it; without it
# the probe reports no GPU and the worker runs on the CPU. (A static
# CGO_ENABLED=0 build also works, on any base, but has no GPU probe.)

FROM golang:1.26-trixie AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=1 go build -trimpath -ldflags='-s -w' -o /out/gyre ./cmd/gyre

FROM debian:trixie-slim
RUN useradd --system --uid 10001 --user-group --home-dir /var/lib/gyre --create-home gyre
COPY --from=build /out/gyre /usr/local/bin/gyre
USER 10001:10001
WORKDIR /var/lib/gyre
# Gossip (TCP and UDP) and the data plane (UDP for quic, TCP for tcp).
EXPOSE 7946/tcp 7946/udp 7947/udp 7947/tcp
ENTRYPOINT ["gyre"]
CMD ["--help"]
