package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func write(t *testing.T, path, text string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}

func read(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// Hostile probe D3: `up d` removed d/logs/notes.txt, d/pki/ca.key and d/kubeconfig of a
// directory no plane had used.
func TestClaimDirRefusesADirectoryWhoseNamesAreSomeoneElses(t *testing.T) {
	d := t.TempDir()
	write(t, filepath.Join(d, "logs", "notes.txt"), "notes")
	write(t, filepath.Join(d, "pki", "ca.key"), "mine")
	write(t, filepath.Join(d, "kubeconfig"), "cfg")
	err := claimDir(d)
	if !errors.Is(err, errNotOurs) {
		t.Fatalf("claimDir = %v, want a refusal", err)
	}
	for path, want := range map[string]string{"logs/notes.txt": "notes", "pki/ca.key": "mine", "kubeconfig": "cfg"} {
		if got := read(t, filepath.Join(d, path)); got != want {
			t.Errorf("%s = %q, want %q", path, got, want)
		}
	}
	if regularFile(filepath.Join(d, markerName)) {
		t.Error("a refused directory got the marker")
	}
	// a file where the directory should be is refused too
	f := filepath.Join(d, "file")
	write(t, f, "x")
	if err := claimDir(f); !errors.Is(err, errNotOurs) {
		t.Errorf("claimDir(file) = %v, want a refusal", err)
	}
}

func TestClaimDirCleansOnlyWhatAnEarlierUpMadeAndNeverThroughALink(t *testing.T) {
	d := filepath.Join(t.TempDir(), "new", "plane")
	if err := claimDir(d); err != nil { // a new directory: made, and marked
		t.Fatal(err)
	}
	if !regularFile(filepath.Join(d, markerName)) {
		t.Fatal("no marker in a directory up made")
	}
	// what that up left, a file of the user's beside it, and a link out of the directory
	write(t, filepath.Join(d, "logs", "etcd.log"), "old")
	write(t, filepath.Join(d, "notes.txt"), "mine")
	outside := t.TempDir()
	write(t, filepath.Join(outside, "keep"), "x")
	if err := os.Symlink(outside, filepath.Join(d, "agent")); err != nil {
		t.Fatal(err)
	}
	if err := claimDir(d); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(d, "logs")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("logs left: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(d, "agent")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the agent link left: %v", err)
	}
	if read(t, filepath.Join(outside, "keep")) != "x" || read(t, filepath.Join(d, "notes.txt")) != "mine" {
		t.Error("removed what up did not make")
	}
	// a plane directory from before the marker (its plane.json) is still up's
	old := t.TempDir()
	write(t, filepath.Join(old, "plane.json"), "{}")
	write(t, filepath.Join(old, "pki", "ca.key"), "plane's")
	if err := claimDir(old); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(old, "pki")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("pki of an earlier plane left: %v", err)
	}
}

func TestFileDigest(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f")
	write(t, p, "abc")
	got, err := fileDigest(p)
	want := "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
	if err != nil || got != want {
		t.Fatalf("fileDigest = %q, %v; want %q", got, err, want)
	}
}

// scripts/kube-plane down reads these two lines of plane.json with sed: their shape is
// what writeRecord writes.
func TestTheRecordedBinaryLinesAreWhatDownReads(t *testing.T) {
	d := t.TempDir()
	r := &record{Layout: layout{Dir: d}, Binary: "/c/0123456789abcdef/kube-plane", BinarySHA256: "sha256:" + strings.Repeat("ab", 32)}
	if err := writeRecord(r); err != nil {
		t.Fatal(err)
	}
	text := read(t, recordPath(d))
	for _, line := range []string{
		"\n  \"binary\": \"/c/0123456789abcdef/kube-plane\",\n",
		"\n  \"binarySHA256\": \"sha256:" + strings.Repeat("ab", 32) + "\"\n",
	} {
		if !strings.Contains(text, line) {
			t.Errorf("plane.json lacks the line %q:\n%s", line, text)
		}
	}
}
