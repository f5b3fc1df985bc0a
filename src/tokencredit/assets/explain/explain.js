(function(){
  var D = JSON.parse(document.getElementById('tc-data').textContent);
  var tip = document.getElementById('tip'), lit = [];
  function f(x, d, s){ if (x === null || x === undefined) return 'n/a';
    var v = x.toFixed(d); if (s && x >= 0) v = '+' + v; return v.replace('-', '\u2212'); }
  function td(tr, text){ var c = document.createElement('td'); c.textContent = text; tr.appendChild(c); }
  function show(s, ev){
    var cell = s.parentNode, r = cell.getAttribute('data-r'), t = +s.getAttribute('data-t');
    var m = cell.getAttribute('data-m'), row = D.rows[r];
    tip.textContent = '';
    var head = document.createElement('div'), tk = document.createElement('span');
    tk.className = 'tk'; tk.textContent = JSON.stringify(row.tokens[t]); head.appendChild(tk);
    head.appendChild(document.createTextNode('  token ' + t + ' of response ' + row.label));
    tip.appendChild(head);
    var info = document.createElement('div');
    info.textContent = 'entropy ' + f(row.entropy ? row.entropy[t] : null, 3) +
      '  ·  probability ' + f(row.prob ? row.prob[t] : null, 3) +
      '  ·  A ' + f(row.advantage, 3, true) + '  ·  reward ' + f(row.reward, 2);
    tip.appendChild(info);
    if (row.first_wrong === t) {
      var fw = document.createElement('div'); fw.className = 'fwtip';
      fw.textContent = 'first wrong token (the task\u2019s checker): ' + row.checker; tip.appendChild(fw);
    }
    var tb = document.createElement('table');
    D.methods.forEach(function(me){
      if (!row.credit[me.name]) return;
      var tr = document.createElement('tr'); if (me.name === m) tr.className = 'cur';
      td(tr, me.name); td(tr, 'Â ' + f(row.credit[me.name][t], 4, true)); tb.appendChild(tr);
    });
    tip.appendChild(tb);
    lit.forEach(function(x){ x.classList.remove('hl'); });
    lit = Array.prototype.slice.call(document.querySelectorAll('.cell[data-r="' + r + '"] .t[data-t="' + t + '"]'));
    lit.forEach(function(x){ x.classList.add('hl'); });
    tip.style.display = 'block'; move(ev);
  }
  function move(ev){
    var w = tip.offsetWidth, h = tip.offsetHeight, x = ev.clientX + 14, y = ev.clientY + 14;
    if (x + w > window.innerWidth - 4) x = ev.clientX - w - 10;
    if (y + h > window.innerHeight - 4) y = ev.clientY - h - 10;
    tip.style.left = Math.max(2, x) + 'px'; tip.style.top = Math.max(2, y) + 'px';
  }
  document.addEventListener('mouseover', function(ev){
    var s = ev.target.closest ? ev.target.closest('.t') : null;
    if (s) show(s, ev); else { tip.style.display = 'none'; lit.forEach(function(x){ x.classList.remove('hl'); }); lit = []; }
  });
  document.addEventListener('mousemove', function(ev){ if (tip.style.display === 'block') move(ev); });
  function paint(shared){
    var scales = {}; D.methods.forEach(function(me){ scales[me.name] = shared ? D.shared_scale : me.scale; });
    document.querySelectorAll('.cell').forEach(function(c){
      var sc = scales[c.getAttribute('data-m')];
      c.querySelectorAll('.t').forEach(function(s){
        var v = +s.getAttribute('data-a'), t = sc > 0 ? Math.max(-1, Math.min(1, v / sc)) : 0;
        var b = t >= 0 ? [33,102,172] : [178,24,43], a = Math.abs(t);
        s.style.background = 'rgb(' + b.map(function(q){ return Math.round(255 * (1 - a) + q * a); }).join(',') + ')';
        s.classList.toggle('d', a > 0.55);
      });
    });
    document.querySelectorAll('.legend[data-m]').forEach(function(l){
      var sc = scales[l.getAttribute('data-m')], v = l.querySelectorAll('.lv');
      v[0].textContent = f(-sc, 2); v[1].textContent = f(sc, 2, true);
    });
  }
  var box = document.getElementById('shared');
  if (box) box.addEventListener('change', function(){ paint(box.checked); });
})();
