package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/gyre-ml/gyre/internal/secret"
)

func newKeygenCmd(c *cli) *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use:   "keygen [--out FILE]",
		Short: "Generate a cluster secret",
		Long: "keygen generates a new 32-byte cluster secret, hex-encoded.\n" +
			"With --out it writes a new file readable only by its owner (it never\n" +
			"overwrites one) and prints the secret's fingerprint to stderr;\n" +
			"without, it prints the secret to stdout.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, err := secret.Generate()
			if err != nil {
				return err
			}
			if out == "" {
				_, err := fmt.Fprintln(cmd.OutOrStdout(), s.Hex())
				return err
			}
			if err := s.WriteFile(out); err != nil {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "wrote cluster secret to %s (fingerprint %s)\n", out, s.Fingerprint())
			return nil
		},
	}
	cmd.Flags().StringVarP(&out, "out", "o", "", "write the secret to this new file (mode 0600) instead of stdout")
	return cmd
}
