# zeusd, the Zeus daemon (crate "zeusd", https://github.com/ml-energy/zeus): the privileged power-limit
# node agent used by deploy/k8s/zeusd-daemonset.yaml and the docker-compose "gpu" profile.
# Build: docker build -f deploy/docker/zeusd.Dockerfile -t carbonflow/zeusd:0.5.0 .
FROM rust:1-bookworm AS build
RUN cargo install zeusd --version 0.5.0 --locked --root /out

FROM debian:bookworm-slim
# NVML (libnvidia-ml.so) is injected at run time by the NVIDIA container runtime.
COPY --from=build /out/bin/zeusd /usr/local/bin/zeusd
ENV NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=utility
ENTRYPOINT ["zeusd"]
CMD ["serve", "--socket-path", "/var/run/zeusd/zeusd.sock", "--socket-permissions", "660"]
