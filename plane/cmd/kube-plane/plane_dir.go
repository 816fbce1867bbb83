package main

// What `up` owns in DIR (issue 44, point 1; hostile probe D3: `up` removed logs, pki, etcd,
// agent and kubeconfig of any existing directory, `up .` a project's logs/): it writes and
// removes only the names in ownedNames, and only in a directory it made its own (the
// marker, or the plane.json of an `up` from before the marker). A directory where one of
// those names is someone else's is refused, nothing removed. And the binary that started
// the plane is recorded by path and digest (record.Binary, record.BinarySHA256), which is
// the only binary `scripts/kube-plane down` runs (hostile probe D11).

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// markerName is the file that says `up` made DIR a plane's directory.
const markerName = ".kube-plane-dir"

// ownedNames are what `up` writes in DIR, removed before it writes them again.
var ownedNames = []string{"pki", "etcd", "agent", "logs", "kubeconfig", "tenant.kubeconfig", "kube-plane"}

// errNotOurs is a directory up will not write in: the caller exits 2.
var errNotOurs = errors.New("not a plane's directory")

func regularFile(path string) bool {
	fi, err := os.Lstat(path)
	return err == nil && fi.Mode().IsRegular()
}

// claimDir makes dir a plane's directory (made when missing) and removes what an earlier
// `up` left there, or refuses it (errNotOurs) when a name up writes is someone else's.
// A name that is a symbolic link is removed as a link: nothing outside dir is touched.
func claimDir(dir string) error {
	fi, err := os.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	case err != nil:
		return err
	case !fi.IsDir():
		return fmt.Errorf("%w: %s is not a directory; give a new or empty directory for the plane", errNotOurs, dir)
	}
	if !regularFile(filepath.Join(dir, markerName)) && !regularFile(recordPath(dir)) {
		var theirs []string
		for _, name := range ownedNames {
			if _, err := os.Lstat(filepath.Join(dir, name)); err == nil {
				theirs = append(theirs, name)
			}
		}
		if len(theirs) > 0 {
			return fmt.Errorf("%w: %s holds %s, and no plane was started there (no %s or plane.json): up writes %s there and removes nothing it did not make; nothing was removed. Give a new or empty directory",
				errNotOurs, dir, strings.Join(theirs, ", "), markerName, strings.Join(ownedNames, ", "))
		}
		if err := writeFileAtomic(filepath.Join(dir, markerName), []byte("a directory of `kube-plane up`\n"), 0o644); err != nil {
			return err
		}
	}
	for _, name := range ownedNames {
		if err := os.RemoveAll(filepath.Join(dir, name)); err != nil {
			return err
		}
	}
	return nil
}

// fileDigest is "sha256:HEX" of the file at path.
func fileDigest(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}
