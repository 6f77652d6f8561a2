// Package archtest holds the tests that keep the architecture as
// docs/architecture.md draws it: the import rules between the layers and
// the purity of the packages that decide. It has no code of its own.
package archtest
