// Package units is the project's one parser and printer of memory sizes
// given by people: the config file, mps-launch --mem and the API all go
// through ParseSize, so `8G` means the same number of bytes everywhere.
//
// Every unit is binary, as MPS reads them: K, M, G and T are powers of 1024,
// with or without "i" and "B" (`8G`, `8GiB`, `8gib`, `512M`, `1.5G`), and a
// bare number is bytes. A lower-case "b" is refused because it conventionally
// means bits. The package also formats sizes for people (FormatSize) and
// renders the pinned-memory limit string that mps/ sends to MPS (MPSLimit).
//
// It owns no state, does no I/O and never logs. It is not MPS's own loose
// parser (where `G` is GiB and anything else MiB); the emulator keeps that.
package units
