package launch

import (
	"regexp"
	"strconv"
	"strings"
	"sync"
)

// report keeps what a worker said as it failed: the lines of its stderr
// from the last one starting with "Error:" (what a cobra command, gyre's
// among them, prints as it fails), or else its last line.
type report struct {
	mu    sync.Mutex
	lines []string
	open  bool // lines began with an "Error:" line
}

// maxReport bounds a report: a joined error has a line per rank.
const maxReport = 64

func (r *report) add(line []byte) {
	s := strings.TrimRight(string(line), "\r\n")
	if strings.TrimSpace(s) == "" {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case strings.HasPrefix(s, "Error:"):
		r.lines, r.open = []string{s}, true
	case !r.open:
		r.lines = []string{s}
	case len(r.lines) < maxReport:
		r.lines = append(r.lines, s)
	}
}

func (r *report) get() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.lines...)
}

var (
	rankWord = regexp.MustCompile(`\brank (\d+)\b`)
	// selfRank is how a no-quorum report names its own worker among the
	// voters it reaches ("rank 0 127.0.0.1:9000 (this worker)"): not a
	// rank it blames.
	selfRank = regexp.MustCompile(`\brank \d+ \S+ \(this worker\)`)
	// logStamp is the date and time the standard library's log package
	// puts before a log.Fatal report.
	logStamp = regexp.MustCompile(`^\d{4}/\d\d/\d\d \d\d:\d\d:\d\d(\.\d+)? `)
)

// named returns the ranks a report names, each line's first: a line such
// as "rank 2 holds a different state from rank 0" names the odd rank
// first, and "lost rank 3 (…)" the lost one; a rank marked "(this
// worker)" is skipped. It also returns, per rank,
// the line that named it.
func named(lines []string) map[int]string {
	ranks := map[int]string{}
	for _, l := range lines {
		m := rankWord.FindStringSubmatch(selfRank.ReplaceAllString(l, ""))
		if m == nil {
			continue
		}
		r, err := strconv.Atoi(m[1])
		if _, seen := ranks[r]; err == nil && !seen {
			ranks[r] = logStamp.ReplaceAllString(strings.TrimSpace(strings.TrimPrefix(l, "Error:")), "")
		}
	}
	return ranks
}

// blame returns the rank that more of the reports name than any other,
// the line of the first report naming it, and the positions of the
// reports that name it; rank -1 if no rank stands out.
func blame(reports [][]string) (rank int, line string, by []int) {
	count := map[int]int{}
	lines := map[int]string{}
	for _, rep := range reports {
		for r, l := range named(rep) {
			count[r]++
			if _, ok := lines[r]; !ok {
				lines[r] = l
			}
		}
	}
	rank, best, tie := -1, 0, false
	for r, n := range count {
		switch {
		case n > best:
			rank, best, tie = r, n, false
		case n == best:
			tie = true
		}
	}
	if rank < 0 || tie {
		return -1, "", nil
	}
	for i, rep := range reports {
		if _, ok := named(rep)[rank]; ok {
			by = append(by, i)
		}
	}
	return rank, lines[rank], by
}
