// Command build-zip writes tilefarm's Blender add-on as the zip Blender's preferences install:
//
//	go run ./blender/addon/build-zip tilefarm-addon.zip
//
// The zip holds blender/addon/tilefarm/ as it is (docs/artists.md).
package main

import (
	"bytes"
	"fmt"
	"os"

	"github.com/tilefarm/tilefarm/blender/addon"
)

func main() {
	if len(os.Args) != 2 || os.Args[1] == "-h" || os.Args[1] == "--help" {
		fmt.Fprintln(os.Stderr, "usage: build-zip OUT.zip\n\nWrites tilefarm's Blender add-on as the zip Blender installs (Preferences > Add-ons > Install).")
		os.Exit(2)
	}
	var buf bytes.Buffer
	if err := addon.WriteZip(&buf); err != nil {
		fmt.Fprintln(os.Stderr, "build-zip:", err)
		os.Exit(1)
	}
	if err := os.WriteFile(os.Args[1], buf.Bytes(), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "build-zip:", err)
		os.Exit(1)
	}
	fmt.Println(os.Args[1])
}
