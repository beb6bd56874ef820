package main

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/herdproof/retryhttp/internal/herd"
)

// runResult is one run of the real herd, as the table and the JSON report
// it. Times are model seconds.
type runResult struct {
	Name    string `json:"name"`
	Clients int    `json:"clients"`
	// Retries counts every attempt after a client's first, those during
	// the outage included.
	Retries int `json:"retries"`
	// OutageAttempts counts the attempts during the outage (all rejected).
	OutageAttempts int `json:"outage_attempts"`
	// RejectedAfter counts the attempts rejected after the outage.
	RejectedAfter int `json:"rejected_after_outage"`
	// Peak is the most arrivals in one window after the outage, and
	// PeakRatio that over the capacity.
	Peak      int     `json:"peak"`
	PeakRatio float64 `json:"peak_ratio"`
	// LastBack is when the last client succeeded; nil if none did.
	LastBack *float64 `json:"last_back_seconds"`
	GaveUp   int      `json:"gave_up"`
	// TimerLate is how late a 10 ms timer fired during the run, the 99th
	// percentile.
	TimerLate   float64 `json:"timer_late_p99_seconds"`
	WallSeconds float64 `json:"wall_seconds"`
	Arrivals    []int   `json:"arrivals"`
}

func summarize(name string, m herd.Model, o outcome) runResult {
	r := runResult{Name: name, Clients: m.Clients, GaveUp: m.Clients - o.succeeded,
		TimerLate: o.late.Seconds(), WallSeconds: o.wall.Seconds(), Arrivals: o.arrivals}
	total := 0
	for k, a := range o.arrivals {
		total += a
		if time.Duration(k)*m.Window >= m.Outage {
			r.Peak = max(r.Peak, a)
		} else {
			r.OutageAttempts += a
		}
	}
	r.Retries = total - m.Clients
	r.RejectedAfter = total - r.OutageAttempts - o.succeeded
	r.PeakRatio = float64(r.Peak) / float64(m.Capacity)
	if o.succeeded > 0 {
		last := o.last.Seconds()
		r.LastBack = &last
	}
	return r
}

// table prints the runs and the ideal.
func table(m herd.Model, runs []runResult) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%-40s %8s %10s %14s %15s %14s %8s\n", "", "", "", "after the outage:", "", "", "")
	fmt.Fprintf(&b, "%-40s %8s %10s %14s %15s %14s %8s\n", "run", "retries", "in outage", "rejected", "peak/capacity", "last back (s)", "gave up")
	for _, r := range runs {
		fmt.Fprintf(&b, "%-40s %8d %10d %14d %14.1fx %14s %8d\n", r.Name, r.Retries, r.OutageAttempts, r.RejectedAfter, r.PeakRatio, lastBack(r), r.GaveUp)
	}
	fmt.Fprintf(&b, "%-40s %8s %10s %14d %14.1fx %14.0f %8d\n", "ideal", "-", "-", 0, 1.0, m.Ideal().Seconds(), 0)
	b.WriteString("retries: every attempt after a client's first; in outage: the attempts during the outage, all rejected.\n")
	return b.String()
}

func lastBack(r runResult) string {
	if r.LastBack == nil {
		return "-"
	}
	return fmt.Sprintf("%.0f", *r.LastBack)
}

// demoRuns are the demo's three runs, by role.
type demoRuns struct {
	None, Full, Budget runResult
}

// conclusions states what the runs' own figures show, in the precision the
// table prints them, so that no sentence can contradict the table.
func conclusions(m herd.Model, r demoRuns) []string {
	var out []string
	// The peaks after the outage, as the table rounds them.
	full, none := round(r.Full.PeakRatio, 1), round(r.None.PeakRatio, 1)
	s := fmt.Sprintf("After the outage, arrivals peaked at %.1fx the capacity with full jitter and %.1fx without jitter", full, none)
	switch {
	case full < none:
		s += ": jitter spread the herd out."
	case full > none:
		s += ": in this run jitter did not spread the herd out, its peak was the higher."
	default:
		s += ": in this run jitter did not lower the peak."
	}
	out = append(out, s)

	// When everyone was back.
	fb, nb := r.Full.LastBack, r.None.LastBack
	switch {
	case fb != nil && nb != nil:
		f, n := round(*fb, 0), round(*nb, 0)
		cmp := "as late as"
		if f < n {
			cmp = "sooner than"
		} else if f > n {
			cmp = "later than"
		}
		out = append(out, fmt.Sprintf("The last client was back at %.0f s with full jitter, %s without jitter (%.0f s); the ideal is %.0f s.",
			f, cmp, n, m.Ideal().Seconds()))
	case fb != nil:
		out = append(out, fmt.Sprintf("With full jitter the last client was back at %.0f s; without jitter, %d clients never were.", *fb, r.None.GaveUp))
	case nb != nil:
		out = append(out, fmt.Sprintf("Without jitter the last client was back at %.0f s; with full jitter, %d clients never were.", *nb, r.Full.GaveUp))
	}

	// Rejections after the outage.
	out = append(out, fmt.Sprintf("After the outage the server rejected %d attempts with full jitter, %s without jitter (%d).",
		r.Full.RejectedAfter, fewerMore(r.Full.RejectedAfter, r.None.RejectedAfter), r.None.RejectedAfter))

	// The budget.
	b := r.Budget
	who := fmt.Sprintf("%d of %d clients gave up", b.GaveUp, b.Clients)
	switch b.GaveUp {
	case b.Clients:
		who = "every client gave up"
	case 0:
		who = "no client gave up"
	}
	wanted := b.Clients * 2 // 3 attempts: 2 retries each, all inside the outage (1 s + 2 s of waits at most, in 10 s)
	out = append(out, fmt.Sprintf("With 3 attempts and the default budget, %s; the budget paid for %d retries in all, where 3 attempts without a budget would send %d into the outage.",
		who, b.Retries, wanted))

	// Whether the machine kept up with the clock.
	late := 0.0
	for _, x := range []runResult{r.None, r.Full, r.Budget} {
		late = max(late, x.TimerLate)
	}
	// Half a window late, arrivals meant for one window land in the next.
	s = fmt.Sprintf("Timers fired up to %.2f model seconds late (99th percentile)", late)
	if late >= 0.5*m.Window.Seconds() {
		s += ": the machine was too busy for this time scale. Late timers bunch arrivals up, so these runs are not the model's; a larger -scale slows the clock."
	} else {
		s += ", under half a model second: the machine kept up with the clock."
	}
	return append(out, s)
}

// round is x as the table prints it (fmt's rounding, which math.Round
// does not match on halves: 3.65 prints as 3.6).
func round(x float64, decimals int) float64 {
	r, _ := strconv.ParseFloat(strconv.FormatFloat(x, 'f', decimals, 64), 64)
	return r
}

func fewerMore(a, b int) string {
	switch {
	case a < b:
		return "fewer than"
	case a > b:
		return "more than"
	}
	return "as many as"
}

// wrap breaks s into lines of at most width characters.
func wrap(s string, width int) string {
	var b strings.Builder
	n := 0
	for _, w := range strings.Fields(s) {
		if n > 0 && n+1+len(w) > width {
			b.WriteString("\n")
			n = 0
		} else if n > 0 {
			b.WriteString(" ")
			n++
		}
		b.WriteString(w)
		n += len(w)
	}
	return b.String()
}
