# Multi-stage release build of the raygate operator (to be completed: see issue 5).
FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin raygate

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/raygate /raygate
USER nonroot
ENTRYPOINT ["/raygate"]
