package platform

import "testing"

// FreeBytes answers for a real directory and fails, naming it, for one that is not there.
func TestFreeBytes(t *testing.T) {
	if free, err := FreeBytes(t.TempDir()); err != nil || free == 0 {
		t.Fatalf("FreeBytes of a temporary directory = %d, %v", free, err)
	}
	if _, err := FreeBytes("/no/such/dir/here"); err == nil {
		t.Fatal("FreeBytes of a missing directory succeeded")
	}
}
