//go:build unix

package platform

import (
	"errors"
	"os"
)

// SyncDir makes a rename or link in dir durable: the directory's entry is on disk once it
// returns, so a crash after it cannot take back a promotion.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil && !errors.Is(err, os.ErrInvalid) {
		return err
	}
	return nil
}
