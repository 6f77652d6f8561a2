package checkpoint

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// File names: ckpt-e<epoch>-i<iter>.gyre, both numbers zero-padded to 20
// digits so that names sort as (epoch, iteration) do; temporary files
// start with a dot, so no listing takes them for checkpoints.
const (
	filePrefix = "ckpt-"
	fileSuffix = ".gyre"
	tempPrefix = ".ckpt-"
	tempSuffix = ".tmp"
)

// FileName returns the name of the checkpoint of (epoch, iter).
func FileName(epoch uint64, iter int64) string {
	return fmt.Sprintf("%se%020d-i%020d%s", filePrefix, epoch, iter, fileSuffix)
}

// parseName returns the (epoch, iter) a checkpoint's file name says.
func parseName(name string) (epoch uint64, iter int64, ok bool) {
	body, found := strings.CutPrefix(name, filePrefix)
	body, found2 := strings.CutSuffix(body, fileSuffix)
	e, i, found3 := strings.Cut(body, "-i")
	if !found || !found2 || !found3 || !strings.HasPrefix(e, "e") {
		return 0, 0, false
	}
	epoch, err := strconv.ParseUint(e[1:], 10, 64)
	if err != nil {
		return 0, 0, false
	}
	iter, err = strconv.ParseInt(i, 10, 64)
	if err != nil || iter < 0 {
		return 0, 0, false
	}
	return epoch, iter, FileName(epoch, iter) == name
}

// Dir is a directory of checkpoints, as one worker sees it: Owner names
// the worker in its temporary files, so that in a directory that workers
// share, none removes a file another is still writing.
type Dir struct {
	Path  string
	Owner string
}

// Info names one checkpoint file.
type Info struct {
	Name  string
	Epoch uint64
	Iter  int64
}

// List returns the directory's checkpoint files, newest first, by their
// names; it reads none of them.
func (d Dir) List() ([]Info, error) {
	ents, err := os.ReadDir(d.Path)
	if err != nil {
		return nil, err
	}
	var out []Info
	for _, e := range ents {
		if epoch, iter, ok := parseName(e.Name()); ok && e.Type().IsRegular() {
			out = append(out, Info{Name: e.Name(), Epoch: epoch, Iter: iter})
		}
	}
	slices.SortFunc(out, func(a, b Info) int {
		switch {
		case a.Epoch != b.Epoch:
			return cmpDesc(a.Epoch, b.Epoch)
		default:
			return cmpDesc(a.Iter, b.Iter)
		}
	})
	return out, nil
}

func cmpDesc[T int64 | uint64](a, b T) int {
	switch {
	case a > b:
		return -1
	case a < b:
		return 1
	}
	return 0
}

// Load reads and checks the checkpoint file name.
func (d Dir) Load(name string) (*Snapshot, error) { return d.read(name, true) }

// read is Load, keeping the values or only checking them.
func (d Dir) read(name string, keep bool) (*Snapshot, error) {
	path := filepath.Join(d.Path, name)
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	s, err := decode(f, st.Size(), path, keep)
	if err != nil {
		return nil, err
	}
	if epoch, iter, _ := parseName(name); s.Epoch != epoch || s.Iter != iter {
		return nil, fmt.Errorf("%w: %s: holds epoch %d iteration %d, not what its name says", ErrCorrupt, path, s.Epoch, s.Iter)
	}
	return s, nil
}

// Newest returns the newest checkpoint of the directory that reads as
// valid, or nil if there is none, with an error for each newer file that
// did not (truncated, damaged, unreadable), naming it. A directory that
// does not exist holds none. The snapshot holds no values: Load reads
// them.
func (d Dir) Newest() (*Snapshot, string, []error) {
	infos, err := d.List()
	if errors.Is(err, fs.ErrNotExist) {
		return nil, "", nil
	}
	if err != nil {
		return nil, "", []error{fmt.Errorf("checkpoint: list %s: %w", d.Path, err)}
	}
	var bad []error
	for _, in := range infos {
		s, err := d.read(in.Name, false)
		if err == nil {
			return s, in.Name, bad
		}
		bad = append(bad, err)
	}
	return nil, "", bad
}

// HighestEpoch returns the highest epoch any checkpoint file of the
// directory names, valid or not (0 if none): checkpoints written after
// it must carry a higher one, or Prune would take them for older.
func (d Dir) HighestEpoch() uint64 {
	infos, err := d.List()
	if err != nil || len(infos) == 0 {
		return 0
	}
	return infos[0].Epoch
}

// Write writes s into the directory atomically, as FileName(s.Epoch,
// s.Iter): a temporary file (mode 0600) that is synced, closed and
// renamed, then a sync of the directory. A failure removes the temporary
// file and leaves every existing checkpoint as it was.
func (d Dir) Write(s *Snapshot) (name string, err error) { return d.write(s, nil) }

// write is Write, the file's bytes going through wrap if it is not nil.
func (d Dir) write(s *Snapshot, wrap func(io.Writer) io.Writer) (name string, err error) {
	name = FileName(s.Epoch, s.Iter)
	f, err := os.CreateTemp(d.Path, d.tempPattern())
	if err != nil {
		return name, err
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
		}
	}()
	if err = f.Chmod(0o600); err != nil {
		return name, err
	}
	var out io.Writer = f
	if wrap != nil {
		out = wrap(f)
	}
	if err = Encode(out, s); err != nil {
		return name, err
	}
	if err = f.Sync(); err != nil {
		return name, err
	}
	if err = f.Close(); err != nil {
		return name, err
	}
	if err = os.Rename(tmp, filepath.Join(d.Path, name)); err != nil {
		return name, err
	}
	return name, syncDir(d.Path)
}

// syncDir makes a rename in dir durable.
func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// tempPattern is the pattern of this owner's temporary files.
func (d Dir) tempPattern() string { return tempPrefix + safeName(d.Owner) + "~*" + tempSuffix }

// safeName keeps letters, digits, dots and dashes of id, so that a worker
// ID (an address, with colons) fits in a file name; it never makes a
// tilde, which ends the owner in a temporary file's name.
func safeName(id string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '.', r == '-':
			return r
		}
		return '_'
	}, id)
}

// staleTemp is how long another owner's temporary file may go unmodified
// before Prune takes it for one its writer left when it died.
const staleTemp = time.Hour

// Prune removes every checkpoint but the newest keep (keep < 1 keeps
// them all), and temporary files a writer left when it died: this
// owner's (it writes one at a time, and is not writing now), and any
// other's unmodified for an hour.
func (d Dir) Prune(keep int) error {
	ents, err := os.ReadDir(d.Path)
	if err != nil {
		return err
	}
	own := strings.TrimSuffix(d.tempPattern(), "*"+tempSuffix) // up to the tilde
	var errs []error
	for _, e := range ents {
		name := e.Name()
		if !strings.HasPrefix(name, tempPrefix) || !strings.HasSuffix(name, tempSuffix) {
			continue
		}
		if !strings.HasPrefix(name, own) {
			if info, err := e.Info(); err != nil || time.Since(info.ModTime()) < staleTemp {
				continue
			}
		}
		if err := os.Remove(filepath.Join(d.Path, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	infos, err := d.List()
	if err != nil || keep < 1 || len(infos) <= keep {
		return errors.Join(append(errs, err)...)
	}
	for _, in := range infos[keep:] {
		if err := os.Remove(filepath.Join(d.Path, in.Name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Marker files say which workers use a directory: each writes one as it
// joins, holding its ID, so that workers sharing the directory find each
// other (docs/checkpoints.md, "Who writes").
const (
	markerPrefix = "worker-"
	markerSuffix = ".marker"
)

// Mark records that the worker id uses the directory, creating the
// directory if need be.
func (d Dir) Mark(id string) error {
	if err := os.MkdirAll(d.Path, 0o700); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(d.Path, markerPrefix+safeName(id)+markerSuffix), []byte(id), 0o600)
}

// Marked returns the IDs of the workers that marked the directory.
func (d Dir) Marked() (map[string]bool, error) {
	ents, err := os.ReadDir(d.Path)
	if err != nil {
		return nil, err
	}
	ids := map[string]bool{}
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), markerPrefix) || !strings.HasSuffix(e.Name(), markerSuffix) {
			continue
		}
		b, err := os.ReadFile(filepath.Join(d.Path, e.Name()))
		if err != nil {
			continue // removed since the listing
		}
		ids[string(b)] = true
	}
	return ids, nil
}
